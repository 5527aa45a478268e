"""Qwen3 (dense): per-head RMSNorm on queries and keys, no biases."""

from __future__ import annotations

from .layers import Layout, Shape, convert_to_hf, convert_to_megatron

MODEL_TYPES = ("qwen3",)
LAYOUT = Layout(qk_norm=True)


def layout(config) -> Layout:
    return LAYOUT


def to_megatron(hf_state: dict, config) -> dict:
    return convert_to_megatron(hf_state, Shape.of(config), LAYOUT)


def to_hf(mc_state: dict, config) -> dict:
    return convert_to_hf(mc_state, Shape.of(config), LAYOUT)
