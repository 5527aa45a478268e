"""Tiny Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 attention with a routed MoE in every layer, Qwen's tokens and
tunesmith's qwen3 template. Training adds its router load-balancing loss (router_aux_loss_coef)."""

from __future__ import annotations

from .qwen3 import ARCHS as _QWEN3

ARCHS: dict[str, dict] = {
    "qwen3_moe": {
        **_QWEN3["qwen3"],
        "config_class": "Qwen3MoeConfig",
        "config": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                   "router_aux_loss_coef": 0.001},
    },
}
