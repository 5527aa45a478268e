"""SwiGLU of a fused gate/up projection's output as two Triton kernels: x [..., 2F] (gate, then up) -> [..., F].

megatron-core's MLP holds gate and up as one linear (`linear_fc1`) and, without Transformer Engine, applies
`silu(gate) * up` on the two halves as separate PyTorch kernels (silu, multiply; in the backward their gradients
and the concatenation of the halves' gradients). Here one forward kernel reads both halves and writes the
product, and one backward kernel writes the gradient of the whole [..., 2F] input; only the input is kept for the
backward (silu is recomputed there), as Liger's SwiGLU does for separate gate and up tensors.

Numerics: gate and up are read in fp32, silu(gate) * up is computed in fp32 and rounded once to the input's dtype
(PyTorch's form rounds silu's output first); the gradients likewise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # features a program handles of one row


@triton.jit
def _forward_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < cols
    gate = tl.load(x_ptr + row * 2 * cols + c, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * cols + cols + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * cols + c, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, dx_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < cols
    dy = tl.load(dy_ptr + row * cols + c, mask=ok, other=0.0).to(tl.float32)
    gate = tl.load(x_ptr + row * 2 * cols + c, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * cols + cols + c, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    d_gate = dy * up * (sig + silu * (1.0 - sig))
    tl.store(dx_ptr + row * 2 * cols + c, d_gate.to(dx_ptr.dtype.element_ty), mask=ok)
    tl.store(dx_ptr + row * 2 * cols + cols + c, (dy * silu).to(dx_ptr.dtype.element_ty), mask=ok)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        shape, cols = x.shape, x.shape[-1] // 2
        x2 = x.reshape(-1, 2 * cols).contiguous()
        y = torch.empty((x2.shape[0], cols), dtype=x.dtype, device=x.device)
        if x2.shape[0]:
            _forward_kernel[(x2.shape[0], triton.cdiv(cols, BLOCK))](x2, y, cols, BLOCK=BLOCK)
        ctx.save_for_backward(x2)
        ctx.shape = shape
        return y.view(*shape[:-1], cols)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        cols = x2.shape[1] // 2
        dy2 = dy.reshape(-1, cols).contiguous()
        dx = torch.empty_like(x2)
        if x2.shape[0]:
            _backward_kernel[(x2.shape[0], triton.cdiv(cols, BLOCK))](dy2, x2, dx, cols, BLOCK=BLOCK)
        return dx.view(ctx.shape)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of x [..., 2F] (its first half the gate, its second the up projection) through the Triton
    kernels (module docstring)."""
    if x.shape[-1] % 2:
        raise ValueError(f"swiglu needs an even last dimension (gate and up halves), got {x.shape[-1]}")
    return _SwiGLU.apply(x)
