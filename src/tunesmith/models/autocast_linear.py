"""nn.Linear under bf16/fp16 autocast over fp32 weights, with autocast's casts made once and its gradients
written in fp32 by the matmuls themselves.

Under autocast every linear layer casts its fp32 input and weight to bf16, and autograd casts the bf16 gradients
its backward produces back to the fp32 input and weight. In a Qwen3 layer that is 7 weight casts, 5 casts of
the normalised residual stream (q, k and v each cast the same tensor, gate and up too) and 12 casts of
gradients: 6.6% of a step's GPU time and a sixth of its kernel launches on issue 15's workload
(benchmarks/results/2026-12-04-step-sync-and-norms.md). Here:

- an input read by several linears in a row (q/k/v, gate/up) is cast once;
- the backward matmuls write the fp32 gradients directly (cuBLAS's bf16 x bf16 -> fp32 GEMM,
  `torch.mm(..., out_dtype=)`): no bf16 gradient, no cast kernel.

Numerics: the forward is autocast's exactly; a gradient is the same bf16 product accumulated in fp32, rounded
once to fp32 where autocast rounds it to bf16 and widens it. Weights that are not fp32 (pure bf16, FSDP2 or
DeepSpeed half-precision parameters), frozen weights and runs without autocast take nn.Linear's own path.
"""

from __future__ import annotations

import weakref

import torch
from torch.nn import functional as F

_last_cast: tuple = ()  # (weak reference to an input, its version, its cast): the one input q/k/v or gate/up share


def _forget(_ref) -> None:
    global _last_cast
    _last_cast = ()


def _cast_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`, reusing the cast of the previous call when it had the same, unchanged input."""
    global _last_cast
    if x.dtype == dtype:
        return x
    if _last_cast and _last_cast[0]() is x and _last_cast[1] == x._version and _last_cast[2].dtype == dtype:
        return _last_cast[2]
    cast = x.to(dtype)
    _last_cast = (weakref.ref(x, _forget), x._version, cast)
    return cast


def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b written in out_dtype: one GEMM on CUDA; elsewhere (no such kernel) the product widened."""
    if out_dtype == a.dtype:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out_dtype)
    return (a @ b).to(out_dtype)


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        x_cast, w_cast = _cast_once(x, dtype), weight.to(dtype)
        ctx.save_for_backward(x_cast, w_cast)
        ctx.x_dtype, ctx.w_dtype, ctx.bias_dtype = x.dtype, weight.dtype, None if bias is None else bias.dtype
        return F.linear(x_cast, w_cast, None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad):
        x_cast, w_cast = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).to(w_cast.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _mm(rows, w_cast, ctx.x_dtype).view(*grad.shape[:-1], w_cast.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = _mm(rows.t(), x_cast.reshape(-1, x_cast.shape[-1]), ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0, dtype=ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None


def autocast_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward of an nn.Linear: under autocast over a trained fp32 weight through _AutocastLinear, else
    nn.Linear's own."""
    weight, device = module.weight, x.device.type
    if weight.dtype == torch.float32 and weight.requires_grad and torch.is_autocast_enabled(device):
        return _AutocastLinear.apply(x, weight, module.bias, torch.get_autocast_dtype(device))
    return F.linear(x, weight, module.bias)


def use_autocast_linears(model: torch.nn.Module) -> int:
    """Give every plain nn.Linear of `model` (not subclasses: quantised layers, adapters) autocast_linear as
    its forward. Returns how many were changed."""
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = autocast_linear.__get__(module)
            changed += 1
    return changed
