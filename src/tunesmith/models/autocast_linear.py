"""nn.Linear under bf16/fp16 autocast over trained fp32 weights, its weight gradient written in fp32 by the matmul.

Under autocast a linear layer's backward computes its weight gradient in bf16 and autograd widens it to the fp32
weight: a Qwen3 layer's seven weight gradients each take a cast kernel, 196 a step and 4.6 ms of its GPU time on
issue 15's workload (benchmarks/results/2026-12-04-autocast-linear.md). Here the weight-gradient matmul writes
fp32 itself (cuBLAS's bf16 x bf16 -> fp32 GEMM, `torch.mm(..., out_dtype=)`), as does the input-gradient matmul
for an fp32 input. models/kernels.share_input_casts, installed after this, hands the linears that read the same
input one bf16 cast of it.

Numerics: the forward is autocast's exactly; a gradient is the same bf16 product accumulated in fp32, rounded
once to fp32 where autocast rounds it to bf16 and widens it. Frozen or non-fp32 weights (pure bf16, FSDP2 or
DeepSpeed half-precision parameters), forwards without gradients or autocast, and compiled blocks (dynamo
traces nn.Linear's own forward) take nn.Linear's path.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def mm_out_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b written in out_dtype: one GEMM on CUDA; elsewhere (no such kernel) the product widened."""
    if out_dtype == a.dtype:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out_dtype)
    return (a @ b).to(out_dtype)


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        x_cast, w_cast = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x_cast, w_cast)
        ctx.x_dtype, ctx.w_dtype, ctx.bias_dtype = x.dtype, weight.dtype, None if bias is None else bias.dtype
        return F.linear(x_cast, w_cast, None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad):
        x_cast, w_cast = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).to(w_cast.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = mm_out_dtype(rows, w_cast, ctx.x_dtype).view(*grad.shape[:-1], w_cast.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = mm_out_dtype(rows.t(), x_cast.reshape(-1, x_cast.shape[-1]), ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0, dtype=ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None


def linear_fp32_grads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      dtype: torch.dtype) -> torch.Tensor:
    """F.linear computed in `dtype` (autocast's), its weight's (and an fp32 input's) gradient written in the
    weight's dtype by the matmul (module docstring)."""
    return _AutocastLinear.apply(x, weight, bias, dtype)


def takes_fp32_grads(weight: torch.Tensor, device: str) -> bool:
    """Whether a linear over `weight` on `device` runs through linear_fp32_grads: a trained fp32 weight, with
    gradients, under autocast, outside torch.compile's tracing."""
    return (weight.dtype == torch.float32 and weight.requires_grad and torch.is_grad_enabled()
            and torch.is_autocast_enabled(device) and not torch.compiler.is_compiling())


def autocast_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward of an nn.Linear: under autocast, with gradients, over a trained fp32 weight through
    _AutocastLinear, else nn.Linear's own."""
    device = x.device.type
    if takes_fp32_grads(module.weight, device):
        return linear_fp32_grads(x, module.weight, module.bias, torch.get_autocast_dtype(device))
    return F.linear(x, module.weight, module.bias)


def use_autocast_linears(model: torch.nn.Module) -> int:
    """Give every plain nn.Linear of `model` (not subclasses: quantised layers, adapters) autocast_linear as
    its forward. Returns how many were changed."""
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = autocast_linear.__get__(module)
            changed += 1
    return changed
