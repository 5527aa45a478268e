"""Qwen3-MoE: Qwen3 attention, a routed mixture of experts in every layer (no shared expert).

transformers 5 holds the experts fused: `mlp.experts.gate_up_proj` [experts, 2 x moe_intermediate, hidden]
(gate rows, then up rows: megatron's linear_fc1 layout per expert) and `mlp.experts.down_proj`
[experts, hidden, moe_intermediate]; the router is `mlp.gate.weight`. megatron-core's local spec keeps one
MLP per expert (SequentialMLP): `mlp.experts.local_experts.<e>.linear_fc1/2`, router `mlp.router.weight`.
"""

from __future__ import annotations

import torch

from ....errors import ModelError
from .layers import Layout, Shape, convert_to_hf, convert_to_megatron

MODEL_TYPES = ("qwen3_moe",)
LAYOUT = Layout(qk_norm=True)


def layout(config) -> Layout:
    sparse_step = getattr(config, "decoder_sparse_step", 1)
    if getattr(config, "mlp_only_layers", None) or sparse_step not in (1, None):
        raise ModelError("this Qwen3-MoE config mixes dense and MoE layers (mlp_only_layers / decoder_sparse_step), "
                         "which the Megatron engine's map does not carry; use backend: single or fsdp2")
    return LAYOUT


def num_experts(config) -> int:
    return getattr(config, "num_local_experts", None) or config.num_experts


def _mlp_to_megatron(hf: dict, i: int) -> dict:
    h, m = f"model.layers.{i}.mlp.", f"decoder.layers.{i}.mlp."
    out = {m + "router.weight": hf[h + "gate.weight"]}
    for e, (fc1, fc2) in enumerate(zip(hf[h + "experts.gate_up_proj"], hf[h + "experts.down_proj"])):
        out[f"{m}experts.local_experts.{e}.linear_fc1.weight"] = fc1
        out[f"{m}experts.local_experts.{e}.linear_fc2.weight"] = fc2
    return out


def _mlp_to_hf(mc: dict, i: int) -> dict:
    h, m = f"model.layers.{i}.mlp.", f"decoder.layers.{i}.mlp."
    count = sum(1 for k in mc if k.startswith(m + "experts.local_experts.") and k.endswith(".linear_fc1.weight"))
    return {h + "gate.weight": mc[m + "router.weight"],
            h + "experts.gate_up_proj": torch.stack(
                [mc[f"{m}experts.local_experts.{e}.linear_fc1.weight"] for e in range(count)]),
            h + "experts.down_proj": torch.stack(
                [mc[f"{m}experts.local_experts.{e}.linear_fc2.weight"] for e in range(count)])}


def to_megatron(hf_state: dict, config) -> dict:
    layout(config)
    return convert_to_megatron(hf_state, Shape.of(config), LAYOUT, _mlp_to_megatron)


def to_hf(mc_state: dict, config) -> dict:
    return convert_to_hf(mc_state, Shape.of(config), LAYOUT, _mlp_to_hf)
