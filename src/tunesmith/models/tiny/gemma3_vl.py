"""Tiny Gemma 3 vision-language (Gemma3ForConditionalGeneration): the tiny Gemma 3 text model behind a SigLIP tower.

The real model's SigLIP tower sees a fixed 896x896 image as 64x64 patches, which the projector
average-pools to 16x16 = 256 soft tokens; the tiny one sees 56x56 as 4x4 patches of 14 pixels,
pooled 2x2 into 4 soft tokens, so the pooling path runs. Images are always resized to the tower's
square (no pixel budget changes the token count); pan-and-scan crops are off, as in the processor's
defaults. The language model keeps the text arch's sliding-window and global layers.
"""

from __future__ import annotations

from .common import SPLIT_QWEN, text_config, token_ids
from .gemma3 import ARCHS as _TEXT_ARCHS

_IMAGE_SIZE, _PATCH, _SOFT_TOKENS = 56, 14, 4

# Gemma 3's own template, written from its format: a system prompt opens the first user turn,
# content is a string or typed parts, and an image part writes <start_of_image>, which the processor
# expands to the image's soft tokens between <start_of_image> and <end_of_image>.
def gemma_media_template(name: str, media_parts: str) -> str:
    """Gemma's turn format with typed content parts; `media_parts` renders an item of another type than text (Jinja
    `if` / `elif` branches on item['type'])."""
    return (
        f"{{%- if tools %}}{{{{ raise_exception('this {name} template renders no tools; drop the tools column') }}}}"
        "{% endif %}"
        "{{ bos_token }}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{%- if messages[0]['content'] is string %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
        "{%- else %}{%- set first = messages[0]['content'][0]['text'] + '\\n\\n' %}{%- endif %}"
        "{%- set loop_messages = messages[1:] %}"
        "{%- else %}{%- set first = '' %}{%- set loop_messages = messages %}{%- endif %}"
        "{%- for message in loop_messages %}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') }}"
        "{%- if message['content'] is string %}{{ message['content'] | trim }}"
        "{%- else %}{%- for item in message['content'] %}"
        + media_parts +
        "{%- elif item['type'] == 'text' %}{{ item['text'] | trim }}{%- endif %}"
        "{%- endfor %}{%- endif %}"
        "{{ '<end_of_turn>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
    )


_GEMMA3_VL_TEMPLATE = gemma_media_template("Gemma 3", "{%- if item['type'] == 'image' %}{{ '<start_of_image>' }}")

_TEXT = _TEXT_ARCHS["gemma3"]

ARCHS: dict[str, dict] = {
    "gemma3_vl": {
        "config_class": "Gemma3Config", "model_class": "Gemma3ForConditionalGeneration",
        "processor_class": "Gemma3Processor", "chat_template_text": _GEMMA3_VL_TEMPLATE,
        "split": SPLIT_QWEN,
        # the real tokenizer's image tokens, after its turn tokens
        "special": _TEXT["special"] + [("<start_of_image>", True), ("<end_of_image>", True),
                                       ("<image_soft_token>", True)],
        "roles": _TEXT["roles"], "extra_eos": _TEXT["extra_eos"],
        # the processor reads these from the tokenizer, as from the real tokenizer_config.json
        "token_attrs": {"extra_special_tokens": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                                 "image_token": "<image_soft_token>"}},
        "tie_word_embeddings": True, "modalities": ["image"],
        "image_processor": {"class": "Gemma3ImageProcessor", "size": {"height": _IMAGE_SIZE, "width": _IMAGE_SIZE},
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        "processor_kwargs": {"image_seq_length": _SOFT_TOKENS},
        "text": dict(_TEXT["config"]),
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _IMAGE_SIZE, "patch_size": _PATCH, "vision_use_head": False},
        # transformers starts the projection at zeros, which would keep every gradient from the vision tower; a
        # trained checkpoint's maps the normed features to about the scale of the (sqrt(hidden)-scaled) embeddings
        "init_std": {"model.multi_modal_projector.mm_input_projection_weight": 0.03},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import Gemma3Config

    text = text_config(spec, tokenizer, head_dim=16, **spec["text"])
    return Gemma3Config(
        text_config=text, vision_config=dict(spec["vision"]), mm_tokens_per_image=_SOFT_TOKENS,
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, boi_token_index="<start_of_image>", eoi_token_index="<end_of_image>",
                    image_token_index="<image_soft_token>"),
    )
