"""Tiny Phi-4-multimodal (Phi4MultimodalForCausalLM, transformers' native class): a SigLIP-style image encoder with
dynamic high-resolution crops and a 2x2 token compression, a Conformer audio encoder, both feeding a Phi-3 language
model (fused qkv_proj and gate_up_proj) through their own projectors inside `model.embed_tokens_extend`.

Crops are 448x448 as in the real model (its image processor counts tokens for that size: the global crop's 16x16
compressed patches, then each sub-crop's); the tiny tower is 2 narrow layers, so that costs little, and at most 4
sub-crops. The chat template writes <|image|> and <|audio|>; the processor repeats each once per embedding.
"""

from __future__ import annotations

from .common import NUM_MEL_BINS, SPLIT_LLAMA, text_config, token_ids

_CROP, _PATCH, _MAX_CROPS = 448, 14, 4

# Phi-4-multimodal's format: <|system|>, <|user|> and <|assistant|> turns ending with <|end|>; media parts first.
_PHI4MM_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Phi-4-multimodal template renders no tools; drop the tools column') }}"
    "{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<|image|>' }}"
    "{%- elif part['type'] == 'audio' %}{{ '<|audio|>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "phi4_multimodal": {
        "config_class": "Phi4MultimodalConfig", "model_class": "Phi4MultimodalForCausalLM",
        "processor_class": "Phi4MultimodalProcessor", "chat_template_text": _PHI4MM_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [(t, True) for t in ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
                                        "<|image|>", "<|audio|>")],
        "roles": {"bos": None, "eos": "<|end|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|endoftext|>"],
        "token_attrs": {"extra_special_tokens": {"image_token": "<|image|>", "audio_token": "<|audio|>"}},
        "tie_word_embeddings": False, "modalities": ["image", "audio"],
        "image_processor": {"class": "Phi4MultimodalImageProcessor", "size": {"height": _CROP, "width": _CROP},
                            "patch_size": _PATCH, "dynamic_hd": _MAX_CROPS},
        "audio_processor": {"class": "Phi4MultimodalFeatureExtractor", "feature_size": NUM_MEL_BINS},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _CROP, "patch_size": _PATCH, "crop_size": _CROP},
        "audio": {"hidden_size": 32, "intermediate_size": 64, "num_blocks": 2, "num_attention_heads": 2,
                  "input_size": NUM_MEL_BINS, "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32,
                  "nemo_conv_channels": 32, "left_chunk": 2, "time_reduction": 8},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import Phi4MultimodalConfig

    ids = token_ids(tokenizer, image="<|image|>", audio="<|audio|>")
    return Phi4MultimodalConfig(
        **text_config(spec, tokenizer),
        vision_config={**spec["vision"], "image_token_id": ids["image"]},
        audio_config={**spec["audio"], "audio_token_id": ids["audio"]},
    )
