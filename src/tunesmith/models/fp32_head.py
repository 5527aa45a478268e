"""`cast_lm_head_to_fp32` (online RL): the output layer's logits in fp32, as the rollout engine computes them.

In bf16 the last step from hidden states to logits rounds every logit to 8 bits of mantissa, and the trainer's
and the sampler's kernels round differently: that rounding is the largest part of the gap between their
log-probs (ScaleRL; TRL's `cast_lm_head_to_fp32`, NeMo-RL's `fp32_lm_head`). Here both sides take the same
half-precision operands (the hidden states and the weight rounded to the compute dtype, exactly what vLLM holds
after a weight push) and multiply them with fp32 products and sums, so only the summation order differs.

On CUDA the forward is one half-precision GEMM that writes its fp32 sums as they are (`torch.mm(...,
out_dtype=torch.float32)`: the tensor cores' products of half-precision numbers are exact and their sums fp32,
only the final rounding is left out), at bf16 speed and without an fp32 copy of the weight; elsewhere the
operands are widened and multiplied in fp32 (the same numbers). The backward is models/autocast_linear.py's
(half-precision products, each gradient written in its tensor's dtype): the gradients are those of the plain
run up to the logits' own rounding.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from ..errors import TunesmithError
from .autocast_linear import mm_out_dtype

HALF = (torch.bfloat16, torch.float16)


def half_matmul_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., H] @ w [V, H].T for half-precision x and w, as fp32 sums (what vLLM's fp32 head computes too)."""
    flat = x.reshape(-1, x.shape[-1])
    # the CPU has no such GEMM: there the operands are widened first, so the sums are fp32 there too
    out = mm_out_dtype(flat, w.t(), torch.float32) if flat.is_cuda else flat.float() @ w.float().t()
    return out.reshape(*x.shape[:-1], w.shape[0])


class _HalfOperandsFp32Logits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, half):
        x, w = hidden.to(half), weight.to(half)
        ctx.save_for_backward(x, w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return half_matmul_fp32(x, w)

    @staticmethod
    def backward(ctx, grad):
        """As models/autocast_linear.py's: half-precision products, each gradient written in its tensor's dtype."""
        x, w = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).to(x.dtype)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = mm_out_dtype(rows, w, ctx.dtypes[0]).view(*grad.shape[:-1], w.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = mm_out_dtype(rows.t(), x.reshape(-1, x.shape[-1]), ctx.dtypes[1])
        return grad_x, grad_w, None


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The half precision the head would run in: autocast's, else the weight's; None for an fp32 run."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        return dtype if dtype in HALF else None
    return weight.dtype if weight.dtype in HALF else None


def fp32_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """hidden @ weight.T (+ bias) in fp32, from the operands rounded to the run's compute dtype."""
    half = compute_dtype(hidden, weight)
    with torch.autocast(hidden.device.type, enabled=False):
        if half is None:
            logits = F.linear(hidden.float(), weight.float())
        else:
            logits = _HalfOperandsFp32Logits.apply(hidden, weight, half)
        if bias is not None:
            logits = logits + (bias.to(half) if half is not None else bias).float()
    return logits


def install_fp32_head(model) -> None:
    """The model's output layer returns fp32 logits (fp32_logits); its parameters and names are unchanged."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise TunesmithError(f"cast_lm_head_to_fp32 needs a plain linear output layer; this model's is "
                             f"{type(head).__name__} (LoRA on lm_head?): remove lm_head from lora_target, or set "
                             "cast_lm_head_to_fp32: false")
    head.forward = types.MethodType(_fp32_head_forward, head)  # a deep copy (a reference model) gets its own


def _fp32_head_forward(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    return fp32_logits(hidden, head.weight, head.bias)
