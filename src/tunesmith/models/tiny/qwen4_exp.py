"""Tiny Qwen4-Exp (text, Qwen4ExpForCausalLM), the newest Qwen text family in transformers 5.24: Gated
DeltaNet linear-attention layers and full-attention layers with a QSA token indexer, a routed MoE with a
shared expert in every layer, and hyper-connections (several residual streams), with Qwen's tokens and
tunesmith's qwen3 template. Per-layer n-gram embeddings (PLE) are off, as they are optional in the config.

Like Qwen3.5, its linear-attention layers run along the whole row, so packing is refused for it
(models/families.py); training adds its router load-balancing loss.
"""

from __future__ import annotations

from .qwen3 import ARCHS as _QWEN3

ARCHS: dict[str, dict] = {
    "qwen4_exp": {
        **_QWEN3["qwen3"],
        "config_class": "Qwen4ExpTextConfig",
        "config": {"layer_types": ["linear_attention", "indexed_attention"], "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "hc_count": 2,
                   "hc_lowrank": 8, "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                   "indexer_budget": 16, "indexer_compress_ratio": 4},
    },
}
