"""Liger's RoPE as a model runs it: its Triton kernel, called directly.

Liger 0.8 routes every call of its `liger_rotary_pos_emb` through a dispatcher that looks up the environment and
the device's capability again, and sends large RoPE calls with gradients to a CuTe DSL kernel whenever the
`cutlass` package can be imported, which flash-attn-4 installs. That kernel is compiled in memory at the first call
of every process (Liger keeps no cache on disk), and its host time per call was 227 us forward and 241 us backward
against 129 us and 183 us for the Triton kernel, for the same ~26-27 us of GPU time (torch.profiler on issue 15's
workload, H200s: benchmarks/results/2026-12-06-fa4-h200.md, 2026-12-04-lf-workload-loop-profile.txt).
`pin_triton_rope` gives the model's module Liger's Triton RoPE function itself (Triton caches its compiled kernel
on disk): the same rotation in fp32, stored in the input's dtype.
"""

from __future__ import annotations

import sys


def pin_triton_rope(model_type: str) -> bool:
    """Where Liger patched `transformers.models.<model_type>`'s apply_rotary_pos_emb with its dispatching
    function, call its Triton kernel instead; returns whether it did."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return False
    module = sys.modules.get(f"transformers.models.{model_type}.modeling_{model_type}")
    if module is None or getattr(module, "apply_rotary_pos_emb", None) is not liger_rotary_pos_emb:
        return False

    def triton_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return LigerRopeFunction.apply(q, k, cos, sin, position_ids, unsqueeze_dim)

    module.apply_rotary_pos_emb = triton_rope
    return True
