"""Tiny LLaVA-OneVision (LlavaOnevisionForConditionalGeneration): a SigLIP tower, the MLP projector, the learned
newline embedding and a Qwen2 language model.

The real model sees a lone image whole (384x384, 27x27 = 729 tokens) and as tiles at the best-fitting of its
grid pinpoints (up to 6x6 tiles, pooled down past "anyres_max_9"), one newline embedding per feature row; a
record with several images sees each of them whole only (729 tokens and one newline each). The tiny tower sees
28x28 (2x2 patches of 14: 4 tokens), its pinpoints 28x56, 56x28 and 56x56, so both rules run: a lone image's
count follows its aspect ratio, a record's two images are 5 tokens each.

The tokenizer is Qwen's ChatML with <image> and <video>; the chat template writes each turn's images first, one
"<image>\\n" each, then its text, as LLaVA-OneVision's does.
"""

from __future__ import annotations

from .common import CHATML, CHATML_ROLES, SPLIT_QWEN, text_config, token_ids

_TILE, _PATCH = 28, 14
_PINPOINTS = [[_TILE, 2 * _TILE], [2 * _TILE, _TILE], [2 * _TILE, 2 * _TILE]]

# Written from LLaVA-OneVision's ChatML format: a turn's image parts come first, then its text.
_ONEVISION_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this LLaVA-OneVision template renders no tools; drop the tools column') }}"
    "{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] if part['type'] == 'image' %}{{ '<image>\\n' }}{%- endfor %}"
    "{%- for part in message['content'] if part['type'] == 'text' %}{{ part['text'] }}{%- endfor %}"
    "{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "llava_onevision": {
        "config_class": "LlavaOnevisionConfig", "model_class": "LlavaOnevisionForConditionalGeneration",
        "processor_class": "LlavaOnevisionProcessor", "chat_template_text": _ONEVISION_TEMPLATE,
        "split": SPLIT_QWEN,
        "special": CHATML + [("<image>", True), ("<video>", True)],
        "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "LlavaOnevisionImageProcessor", "size": {"height": _TILE, "width": _TILE},
                            "image_grid_pinpoints": _PINPOINTS, "image_mean": [0.5, 0.5, 0.5],
                            "image_std": [0.5, 0.5, 0.5]},
        "video_processor": {"class": "LlavaOnevisionVideoProcessor", "size": {"height": _TILE, "width": _TILE}},
        "processor_kwargs": {"num_image_tokens": (_TILE // _PATCH) ** 2, "vision_feature_select_strategy": "full"},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _TILE, "patch_size": _PATCH, "vision_use_head": False},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import LlavaOnevisionConfig

    return LlavaOnevisionConfig(
        text_config={"model_type": "qwen2", **text_config(spec, tokenizer)},
        vision_config={"model_type": "siglip_vision_model", **spec["vision"]},
        image_grid_pinpoints=_PINPOINTS, vision_feature_select_strategy="full", vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9", tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, image_token_id="<image>", video_token_id="<video>"),
    )
