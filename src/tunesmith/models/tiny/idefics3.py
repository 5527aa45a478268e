"""Tiny Idefics3 / SmolVLM (Idefics3ForConditionalGeneration; the SmolVLM-Instruct checkpoints are this class).

A SigLIP-style vision tower, a pixel-shuffle connector (one linear), and a Llama language model.

The real SmolVLM resizes each image so its longest edge is at most 4x384 (Idefics3: 4x364), splits it into tiles of
the tower's size in rows and columns, and adds the whole image downsized to one tile; each tile is 27x27 (or
26x26) patches, pixel-shuffled by 3 (or 2) into 81 (169) tokens. The tiny one resizes to at most 112 pixels
on the longest edge, its tiles are 56x56 (4x4 patches of 14, shuffled by 2 into 4 tokens), so a 128x96 image
is 2x2 tiles and the global one. The processor writes each tile as <fake_token_around_image><row_R_col_C> and
its <image> tokens, rows ending in a newline, then the global image; the newlines are tokenized in context.

The tokenizer is SmolVLM's (<|im_start|> as bos, <end_of_utterance> ending each turn); the chat template writes
"User:<image>Describe it.<end_of_utterance>\\nAssistant: A cat.<end_of_utterance>\\n".

Tiny SmolVLM2 (SmolVLMForConditionalGeneration, model_type smolvlm: the SmolVLM2 checkpoints): the same parts,
tiles, tokens and format under SmolVLM's own classes, with its video processor beside the image processor (the
processor takes both, and needs the num2words package; tunesmith trains it on images).
"""

from __future__ import annotations

from .common import SPLIT_LLAMA, text_config, token_ids

_TILE, _PATCH, _SCALE = 56, 14, 2
_TOKENS_PER_TILE = (_TILE // _PATCH) ** 2 // _SCALE ** 2

# Written from SmolVLM's conversation format: "<|im_start|>" opens the text, each turn is its capitalized role,
# ":" (": " before text), its parts in order, and <end_of_utterance> with a newline.
_IDEFICS3_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this SmolVLM template renders no tools; drop the tools column') }}{% endif %}"
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- set parts = [{'type': 'text', 'text': message['content']}] if message['content'] is string "
    "else message['content'] %}"
    "{{ message['role'] | capitalize }}"
    "{{ ':' if parts and parts[0]['type'] == 'image' else ': ' }}"
    "{%- for part in parts %}"
    "{%- if part['type'] == 'image' %}{{ '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}"
    "{{ '<end_of_utterance>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ 'Assistant:' }}{%- endif %}"
)

_ROW_COL = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]

ARCHS: dict[str, dict] = {
    "idefics3": {
        "config_class": "Idefics3Config", "model_class": "Idefics3ForConditionalGeneration",
        "processor_class": "Idefics3Processor", "chat_template_text": _IDEFICS3_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                    ("<fake_token_around_image>", True), ("<image>", True), ("<end_of_utterance>", True),
                    ("<global-img>", True)] + [(token, True) for token in _ROW_COL],
        "roles": {"bos": "<|im_start|>", "eos": "<end_of_utterance>", "pad": "<|im_end|>"},
        "extra_eos": [],
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "Idefics3ImageProcessor", "size": {"longest_edge": 2 * _TILE},
                            "max_image_size": {"longest_edge": _TILE}, "do_image_splitting": True},
        "processor_kwargs": {"image_seq_len": _TOKENS_PER_TILE},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _TILE, "patch_size": _PATCH},
    },
}


ARCHS["smolvlm"] = {
    **ARCHS["idefics3"],
    "config_class": "SmolVLMConfig", "model_class": "SmolVLMForConditionalGeneration",
    "processor_class": "SmolVLMProcessor", "vision_model_type": "smolvlm_vision",
    "special": ARCHS["idefics3"]["special"] + [("<video>", True)],
    "image_processor": {**ARCHS["idefics3"]["image_processor"], "class": "SmolVLMImageProcessor"},
    "video_processor": {"class": "SmolVLMVideoProcessor", "size": {"longest_edge": 2 * _TILE},
                        "max_image_size": {"longest_edge": _TILE}},
}


def build_config(spec: dict, tokenizer):
    import transformers

    return getattr(transformers, spec["config_class"])(
        text_config={"model_type": "llama", **text_config(spec, tokenizer)},
        vision_config={"model_type": spec.get("vision_model_type", "idefics3_vision"), **spec["vision"]},
        scale_factor=_SCALE,
        tie_word_embeddings=spec["tie_word_embeddings"], pad_token_id=tokenizer.pad_token_id,
        **token_ids(tokenizer, image_token_id="<image>"),
    )
