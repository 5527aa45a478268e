"""Tiny Qwen3.5 (text, Qwen3_5ForCausalLM): the hybrid of Gated DeltaNet linear-attention layers and gated
full-attention layers (three to one in the real models, one to one here), Qwen's tokens and tunesmith's
qwen3 template.

Its linear-attention layers carry a recurrent state and a causal convolution along the row, so packed
samples would leak into each other: packing is refused for it (models/families.py).
"""

from __future__ import annotations

from .qwen3 import ARCHS as _QWEN3

ARCHS: dict[str, dict] = {
    "qwen3_5": {
        **_QWEN3["qwen3"],
        "config_class": "Qwen3_5TextConfig",
        "config": {"layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4},
    },
}
