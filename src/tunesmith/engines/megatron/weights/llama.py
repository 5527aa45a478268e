"""Llama (2, 3, 3.x): no biases unless `attention_bias`; Llama 3.x RoPE scaling is applied by the engine's
rotary embedding (engines/megatron/rotary.py), from the config."""

from __future__ import annotations

from ....errors import ModelError
from .layers import Layout, Shape, convert_to_hf, convert_to_megatron

MODEL_TYPES = ("llama",)


def layout(config) -> Layout:
    if getattr(config, "mlp_bias", False):
        raise ModelError("a Llama config with mlp_bias: true has biases in its MLP, which the Megatron engine's map "
                         "does not carry; use backend: single or fsdp2 for this model")
    return Layout(qkv_bias=bool(getattr(config, "attention_bias", False)))


def to_megatron(hf_state: dict, config) -> dict:
    if getattr(config, "attention_bias", False) and "model.layers.0.self_attn.o_proj.bias" in hf_state:
        raise ModelError("a Llama config with attention_bias: true also has an output-projection bias, which the "
                         "Megatron engine's map does not carry; use backend: single or fsdp2 for this model")
    return convert_to_megatron(hf_state, Shape.of(config), layout(config))


def to_hf(mc_state: dict, config) -> dict:
    return convert_to_hf(mc_state, Shape.of(config), layout(config))
