"""Qwen2 / Qwen2.5: biases on the query, key and value projections only."""

from __future__ import annotations

from .layers import Layout, Shape, convert_to_hf, convert_to_megatron

MODEL_TYPES = ("qwen2",)
LAYOUT = Layout(qkv_bias=True)


def layout(config) -> Layout:
    return LAYOUT


def to_megatron(hf_state: dict, config) -> dict:
    return convert_to_megatron(hf_state, Shape.of(config), LAYOUT)


def to_hf(mc_state: dict, config) -> dict:
    return convert_to_hf(mc_state, Shape.of(config), LAYOUT)
