"""Tiny Mistral 3 (Mistral3ForConditionalGeneration: Mistral Small 3.1 / 3.2 vision): a Pixtral vision tower, the
patch-merging projector and a tiny Mistral language model; and tiny Pixtral-12B (below).

The real model resizes each image so its longest edge is at most 1540 pixels, in multiples of 28 (14-pixel
patches, merged 2x2 by the projector), one [IMG] token per merged patch, each row closed by [IMG_BREAK] and the
last by [IMG_END]: the token count follows the image's size and aspect ratio. The tiny one's longest edge is at
most 56 pixels, so a 128x96 image is 2x2 merged patches: [IMG][IMG][IMG_BREAK][IMG][IMG][IMG_END].

The tokenizer has Mistral's control tokens ([INST], [/INST], [SYSTEM_PROMPT], the image tokens); the chat
template writes Mistral Small 3.1's format, [IMG] where each image part is.
"""

from __future__ import annotations

from .common import SPLIT_LLAMA, text_config, token_ids

_LONGEST, _PATCH, _MERGE = 56, 14, 2

# Written from Mistral Small 3.1's format: "<s>", a system prompt between [SYSTEM_PROMPT] and [/SYSTEM_PROMPT],
# each user turn between [INST] and [/INST] with its parts in order, each answer closed by </s>.
_MISTRAL3_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Mistral 3 template renders no tools; drop the tools column') }}{% endif %}"
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{ '[INST]' }}"
    "{%- elif message['role'] != 'assistant' %}"
    "{{ raise_exception('Mistral 3 renders system, user and assistant turns only') }}{%- endif %}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '[IMG]' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{ '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{ '[/INST]' }}"
    "{%- else %}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
)

ARCHS: dict[str, dict] = {
    "mistral3": {
        "config_class": "Mistral3Config", "model_class": "Mistral3ForConditionalGeneration",
        "processor_class": "PixtralProcessor", "chat_template_text": _MISTRAL3_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
                    ("[IMG]", True), ("[IMG_BREAK]", True), ("[IMG_END]", True), ("[SYSTEM_PROMPT]", True),
                    ("[/SYSTEM_PROMPT]", True), ("<pad>", True)],
        "roles": {"bos": "<s>", "eos": "</s>", "pad": "<pad>"},
        "extra_eos": [],
        "token_attrs": {"unk_token": "<unk>"},
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "PixtralImageProcessor", "size": {"longest_edge": _LONGEST},
                            "patch_size": {"height": _PATCH, "width": _PATCH}},
        "processor_kwargs": {"patch_size": _PATCH, "spatial_merge_size": _MERGE},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _LONGEST, "patch_size": _PATCH},
    },
}


# Pixtral-12B: a LLaVA checkpoint (LlavaForConditionalGeneration) with the same Pixtral tower, processor, tokens and
# format, and LLaVA's two-layer projector without patch merging (one [IMG] per 14-pixel patch).
ARCHS["pixtral"] = {**ARCHS["mistral3"], "config_class": "LlavaConfig", "model_class": "LlavaForConditionalGeneration",
                    "processor_kwargs": {"patch_size": _PATCH, "spatial_merge_size": 1}}


def build_config(spec: dict, tokenizer):
    import transformers

    # Mistral 3 merges 2x2 patches; Pixtral-12B's LLaVA keeps every patch feature (no CLS token to drop)
    merging = ({"spatial_merge_size": _MERGE} if spec["config_class"] == "Mistral3Config"
               else {"vision_feature_select_strategy": "full"})
    return getattr(transformers, spec["config_class"])(
        text_config={"model_type": "mistral", **text_config(spec, tokenizer), "sliding_window": None},
        vision_config={"model_type": "pixtral", **spec["vision"]}, **merging,
        vision_feature_layer=-1, tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, image_token_index="[IMG]"),
    )
