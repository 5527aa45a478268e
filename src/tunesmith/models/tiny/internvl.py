"""Tiny InternVL 3 (the transformers-native InternVLForConditionalGeneration of the "-hf" checkpoints).

An InternViT vision tower, a pixel-shuffle MLP projector (layer norm, two linears) and a Qwen2 language model.

The real model cuts each image into up to 12 tiles of 448x448 at the grid that best fits its aspect ratio, plus
a 448x448 thumbnail when there is more than one tile; each tile is 32x32 patches of 14 pixels, pixel-shuffled
by 0.5 into 256 tokens. The tiny one's tiles are 56x56 (4x4 patches, shuffled into 4 tokens), at most 4 of them
plus the thumbnail, so the token count follows the aspect ratio (after the pixel budget) as in the real model.

The tokenizer is Qwen's ChatML with InternVL's image tokens: the chat template writes <IMG_CONTEXT> where each
image part is, and the processor expands it to <img>, 4 <IMG_CONTEXT> per tile, </img>.
"""

from __future__ import annotations

from .common import CHATML, CHATML_ROLES, SPLIT_QWEN, text_config, token_ids

_TILE, _PATCH, _MAX_TILES = 56, 14, 4
_TOKENS_PER_TILE = (_TILE // _PATCH) ** 2 // 4  # pixel shuffle by 0.5 in both directions

# Written from InternVL 3's ChatML format: each image part is <IMG_CONTEXT> and a newline, each video part
# <video> and a newline, before the turn's text.
_INTERNVL_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this InternVL template renders no tools; drop the tools column') }}{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{%- elif part['type'] == 'video' %}{{ '<video>\\n' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_IMAGE_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                 "video_token": "<video>"}

ARCHS: dict[str, dict] = {
    "internvl": {
        "config_class": "InternVLConfig", "model_class": "InternVLForConditionalGeneration",
        "processor_class": "InternVLProcessor", "chat_template_text": _INTERNVL_TEMPLATE,
        "split": SPLIT_QWEN,
        "special": CHATML + [(token, True) for token in _IMAGE_TOKENS.values()],
        "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        # the processor reads these from the tokenizer, as from the real tokenizer_config.json
        "token_attrs": {"extra_special_tokens": dict(_IMAGE_TOKENS)},
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "GotOcr2ImageProcessor", "size": {"height": _TILE, "width": _TILE},
                            "crop_to_patches": True, "min_patches": 1, "max_patches": _MAX_TILES},
        "video_processor": {"class": "InternVLVideoProcessor", "size": {"height": _TILE, "width": _TILE}},
        "processor_kwargs": {"image_seq_length": _TOKENS_PER_TILE},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": [_TILE, _TILE], "patch_size": [_PATCH, _PATCH]},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import InternVLConfig

    return InternVLConfig(
        text_config={"model_type": "qwen2", **text_config(spec, tokenizer)}, vision_config=dict(spec["vision"]),
        downsample_ratio=0.5, image_seq_length=_TOKENS_PER_TILE, vision_feature_layer=-1,
        tie_word_embeddings=spec["tie_word_embeddings"], **token_ids(tokenizer, image_token_id="<IMG_CONTEXT>"),
    )
