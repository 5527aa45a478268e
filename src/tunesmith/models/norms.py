"""RMSNorm through PyTorch's fused kernel (`torch.nn.functional.rms_norm`, one kernel each way on CUDA).

Liger's RMSNorm is a Triton kernel launched from Python: on an H200 its forward and backward cost 0.6-0.7 ms
of host time per norm (benchmarks/results/2026-12-04-step-sync-and-norms.md), and a Qwen3 step runs 113 of
them, so the host, not the GPU, set the pace of the step. PyTorch's fused kernel does the same work for a
quarter of the host time, and as fast on the GPU for norms over the hidden size; over the q/k heads' 128
features its weight-gradient reduction is slow, so those keep Liger's kernel. Numerics: as Liger's, the
output has the input's dtype; under bf16 autocast the fp32 residual stream is normalised in fp32 exactly as
transformers does (up to the order of the sum); a half-precision input is normalised and scaled in fp32 and
rounded once.
"""

from __future__ import annotations

import torch


def fused_rms_norm(module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The forward of a Llama-style RMSNorm (module.weight, module.variance_epsilon) in PyTorch's kernel, in the
    input's dtype (as Liger's): normalised and scaled in fp32, rounded once."""
    weight = module.weight.to(hidden.dtype)  # a bf16 copy of the q/k norms' 128 weights under autocast
    return torch.nn.functional.rms_norm(hidden, module.weight.shape, weight, module.variance_epsilon)


NARROWEST = 512  # q/k head norms (rows of 64-256) keep Liger's kernel: PyTorch's reduces their weight gradient
# over 126k rows (Qwen3-1.7B, 8k tokens) slowly, 2.5x Liger's GPU time; hidden-size norms are as fast either way


def use_fused_rms_norms(model: torch.nn.Module) -> int:
    """Give every Liger RMSNorm of Llama's form (no weight offset, Llama casting) over NARROWEST or more features
    PyTorch's fused forward; Gemma-style norms (1 + weight) keep Liger's. Returns how many were changed."""
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        return 0
    changed = 0
    for module in model.modules():
        if (isinstance(module, LigerRMSNorm) and module.offset == 0.0 and module.casting_mode == "llama"
                and getattr(module, "weight", None) is not None and module.weight.numel() >= NARROWEST
                and getattr(module, "group_size", None) is None):  # Liger's grouped RMSNorm normalises groups
            module.forward = fused_rms_norm.__get__(module)
            changed += 1
    return changed
