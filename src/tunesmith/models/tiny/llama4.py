"""Tiny Llama 4 (Llama4ForConditionalGeneration, the Scout / Maverick architecture): a ViT with pixel shuffle and
an MLP adapter, a one-matrix projector, and a mixture-of-experts Llama 4 text model (a routed expert plus a shared
one per MoE layer, chunked-attention RoPE layers and a global no-RoPE layer).

The real model cuts each image into up to 16 tiles of 336x336 at the best-fitting canvas plus the whole image
downsized to one tile; each tile is 24x24 patches of 14 pixels, pixel-shuffled by 0.5 into 144 <|patch|> tokens.
The tiny one's tiles are 56x56 (4 patches of 14 a side, shuffled into 4 tokens), at most 4 of them. The chat
template writes <|image|>; the processor expands it to <|image_start|>, the tiles' <|patch|> tokens with
<|tile_x_separator|> / <|tile_y_separator|> between them, <|image|> and the whole image's patches, <|image_end|>.
"""

from __future__ import annotations

from .common import MODEL_SHAPE, SPLIT_LLAMA, text_config, token_ids

_TILE, _PATCH, _MAX_TILES = 56, 14, 4

# Written from Llama 4's format: <|begin_of_text|>, then each turn <|header_start|>role<|header_end|>, a blank line,
# its parts (an image part is <|image|>) and <|eot|>.
_LLAMA4_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Llama 4 template renders no tools; drop the tools column') }}{% endif %}"
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<|image|>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|eot|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"
)

_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>",
            "<|finetune_right_pad|>", "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
            "<|tile_x_separator|>", "<|tile_y_separator|>"]

ARCHS: dict[str, dict] = {
    "llama4": {
        "config_class": "Llama4Config", "model_class": "Llama4ForConditionalGeneration",
        "processor_class": "Llama4Processor", "chat_template_text": _LLAMA4_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [(token, True) for token in _SPECIAL],
        "roles": {"bos": "<|begin_of_text|>", "eos": "<|eot|>", "pad": "<|finetune_right_pad|>"},
        "extra_eos": ["<|end_of_text|>"],
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "Llama4ImageProcessor", "size": {"height": _TILE, "width": _TILE},
                            "max_patches": _MAX_TILES},
        "processor_kwargs": {"patch_size": _PATCH, "pixel_shuffle_ratio": 0.5},
        # layer 0: chunked attention with RoPE (chunks of 16 tokens), layer 1: global attention without RoPE
        "text": {"intermediate_size": 128, "intermediate_size_mlp": 128, "head_dim": 16, "num_local_experts": 2,
                 "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "attention_chunk_size": 16,
                 "no_rope_layers": [1, 0], "layer_types": ["chunked_attention", "full_attention"]},
        # the pixel-shuffle adapter takes 4 x hidden_size (the intermediate size, as in the real 1408 / 5632)
        "vision": {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _TILE, "patch_size": _PATCH, "pixel_shuffle_ratio": 0.5, "vision_output_dim": 64,
                   "projector_input_dim": 64, "projector_output_dim": 64},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import Llama4Config

    text = {"model_type": "llama4_text", **text_config(spec, tokenizer), **spec["text"],
            "hidden_size": MODEL_SHAPE["hidden_size"]}
    return Llama4Config(
        text_config=text, vision_config={"model_type": "llama4_vision_model", **spec["vision"]},
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, boi_token_index="<|image_start|>", eoi_token_index="<|image_end|>",
                    image_token_index="<|patch|>"),
    )
