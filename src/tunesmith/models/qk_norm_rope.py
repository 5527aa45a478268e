"""Qwen3's per-head q/k RMSNorm and the rotary embedding after it, as one Triton kernel forward and one backward.

A Qwen3 attention normalises each q head and each k head (q_norm, k_norm) and then rotates both (RoPE): three
kernels forward and three backward a layer, each launched from Python with its own host time (the norms ~100 us
a call, Liger's RoPE 129 us forward and 183 us backward, benchmarks/results/2026-12-06-adamw-copies-h100.md and
models/liger_rope.py), and each reading and writing q and k again. Here one kernel reads the q and k heads where
the stacked q/k/v projection wrote them (models/fused_projections.py), normalises, scales and rotates them, and
writes q and k for the attention; one backward kernel writes their input gradient and each norm weight's partial
gradient rows (summed by PyTorch in one call). The backward recomputes the norm from its input, as the separate
kernels' saved values would give.

Numerics are those of the separate kernels (models/rms_norm_triton with round_normed, then Liger's RoPE): the row
in fp32, normalised, rounded to the input's dtype, scaled by the weight in fp32 and rounded again (the norm's
output), rotated in fp32 and rounded once more; backward, the rotation's gradient is rounded to the input's dtype
before the norm's backward, as the RoPE kernel's stored gradient was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rms_norm_triton import backward_grid

ROWS = 16  # head rows a program holds at once (x 128 features for Qwen3)


@triton.jit
def _rows(r, heads, q_heads, kv_heads, token_stride, HEAD_DIM: tl.constexpr):
    """A head row's offsets: in the stacked input, in q (for a q head) and in k (for a k head)."""
    t = r // heads
    j = r % heads
    is_q = j < q_heads
    q_row = (t * q_heads + j) * HEAD_DIM
    k_row = (t * kv_heads + j - q_heads) * HEAD_DIM
    return is_q, t, t * token_stride + j * HEAD_DIM, q_row, k_row


@triton.jit
def _forward_kernel(x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, rows, heads, q_heads, kv_heads,
                    token_stride, angle_rows, eps, HALF: tl.constexpr, BLOCK_R: tl.constexpr,
                    ROUND_NORMED: tl.constexpr):
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ok = r < rows
    is_q, t, x_row, q_row, k_row = _rows(r, heads, q_heads, kv_heads, token_stride, 2 * HALF)
    c = tl.arange(0, HALF)
    m = ok[:, None]
    x1 = tl.load(x_ptr + x_row[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_row[:, None] + HALF + c[None, :], mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    n1, n2 = x1 * rstd[:, None], x2 * rstd[:, None]
    if ROUND_NORMED:
        n1 = n1.to(x_ptr.dtype.element_ty).to(tl.float32)
        n2 = n2.to(x_ptr.dtype.element_ty).to(tl.float32)
    q_sel = is_q[:, None]
    w1 = tl.where(q_sel, tl.load(qw_ptr + c)[None, :].to(tl.float32), tl.load(kw_ptr + c)[None, :].to(tl.float32))
    w2 = tl.where(q_sel, tl.load(qw_ptr + HALF + c)[None, :].to(tl.float32),
                  tl.load(kw_ptr + HALF + c)[None, :].to(tl.float32))
    y1 = (n1 * w1).to(q_ptr.dtype.element_ty).to(tl.float32)  # the norm's output
    y2 = (n2 * w2).to(q_ptr.dtype.element_ty).to(tl.float32)
    angle = (t % angle_rows)[:, None] * (2 * HALF) + c[None, :]
    cos1 = tl.load(cos_ptr + angle, mask=m, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + angle + HALF, mask=m, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + angle, mask=m, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + angle + HALF, mask=m, other=0.0).to(tl.float32)
    o1 = (y1 * cos1 - y2 * sin1).to(q_ptr.dtype.element_ty)
    o2 = (y2 * cos2 + y1 * sin2).to(q_ptr.dtype.element_ty)
    to_q, to_k = m & q_sel, m & ~q_sel
    tl.store(q_ptr + q_row[:, None] + c[None, :], o1, mask=to_q)
    tl.store(q_ptr + q_row[:, None] + HALF + c[None, :], o2, mask=to_q)
    tl.store(k_ptr + k_row[:, None] + c[None, :], o1, mask=to_k)
    tl.store(k_ptr + k_row[:, None] + HALF + c[None, :], o2, mask=to_k)


@triton.jit
def _backward_kernel(dq_ptr, dk_ptr, x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, dx_ptr, dw_ptr, rows, heads, q_heads,
                     kv_heads, token_stride, angle_rows, eps, tiles_per_program, HALF: tl.constexpr,
                     BLOCK_R: tl.constexpr, ROUND_NORMED: tl.constexpr, WEIGHT_GRAD: tl.constexpr):
    program = tl.program_id(0)
    c = tl.arange(0, HALF)
    qw1 = tl.load(qw_ptr + c).to(tl.float32)
    qw2 = tl.load(qw_ptr + HALF + c).to(tl.float32)
    kw1 = tl.load(kw_ptr + c).to(tl.float32)
    kw2 = tl.load(kw_ptr + HALF + c).to(tl.float32)
    dwq1 = tl.zeros([HALF], dtype=tl.float32)
    dwq2 = tl.zeros([HALF], dtype=tl.float32)
    dwk1 = tl.zeros([HALF], dtype=tl.float32)
    dwk2 = tl.zeros([HALF], dtype=tl.float32)
    for i in range(tiles_per_program):
        r = ((program * tiles_per_program + i) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        ok = r < rows
        is_q, t, x_row, q_row, k_row = _rows(r, heads, q_heads, kv_heads, token_stride, 2 * HALF)
        m = ok[:, None]
        q_sel = is_q[:, None]
        from_q, from_k = m & q_sel, m & ~q_sel
        do1 = (tl.load(dq_ptr + q_row[:, None] + c[None, :], mask=from_q, other=0.0).to(tl.float32)
               + tl.load(dk_ptr + k_row[:, None] + c[None, :], mask=from_k, other=0.0).to(tl.float32))
        do2 = (tl.load(dq_ptr + q_row[:, None] + HALF + c[None, :], mask=from_q, other=0.0).to(tl.float32)
               + tl.load(dk_ptr + k_row[:, None] + HALF + c[None, :], mask=from_k, other=0.0).to(tl.float32))
        angle = (t % angle_rows)[:, None] * (2 * HALF) + c[None, :]
        cos1 = tl.load(cos_ptr + angle, mask=m, other=0.0).to(tl.float32)
        cos2 = tl.load(cos_ptr + angle + HALF, mask=m, other=0.0).to(tl.float32)
        sin1 = tl.load(sin_ptr + angle, mask=m, other=0.0).to(tl.float32)
        sin2 = tl.load(sin_ptr + angle + HALF, mask=m, other=0.0).to(tl.float32)
        dy1 = (do1 * cos1 + do2 * sin2).to(x_ptr.dtype.element_ty).to(tl.float32)  # RoPE's stored gradient
        dy2 = (do2 * cos2 - do1 * sin1).to(x_ptr.dtype.element_ty).to(tl.float32)
        x1 = tl.load(x_ptr + x_row[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_row[:, None] + HALF + c[None, :], mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        n1, n2 = x1 * rstd[:, None], x2 * rstd[:, None]
        if WEIGHT_GRAD:
            if ROUND_NORMED:
                g1 = dy1 * n1.to(x_ptr.dtype.element_ty).to(tl.float32)
                g2 = dy2 * n2.to(x_ptr.dtype.element_ty).to(tl.float32)
            else:
                g1, g2 = dy1 * n1, dy2 * n2
            dwq1 += tl.sum(tl.where(q_sel, g1, 0.0), axis=0)
            dwq2 += tl.sum(tl.where(q_sel, g2, 0.0), axis=0)
            dwk1 += tl.sum(tl.where(q_sel, 0.0, g1), axis=0)
            dwk2 += tl.sum(tl.where(q_sel, 0.0, g2), axis=0)
        dn1 = dy1 * tl.where(q_sel, qw1[None, :], kw1[None, :])
        dn2 = dy2 * tl.where(q_sel, qw2[None, :], kw2[None, :])
        mean_dn_n = (tl.sum(dn1 * n1, axis=1) + tl.sum(dn2 * n2, axis=1)) / (2 * HALF)
        out = r[:, None] * (2 * HALF) + c[None, :]
        tl.store(dx_ptr + out, (rstd[:, None] * (dn1 - n1 * mean_dn_n[:, None])).to(dx_ptr.dtype.element_ty), mask=m)
        tl.store(dx_ptr + out + HALF, (rstd[:, None] * (dn2 - n2 * mean_dn_n[:, None])).to(dx_ptr.dtype.element_ty),
                 mask=m)
    if WEIGHT_GRAD:
        row = dw_ptr + program * (4 * HALF)
        tl.store(row + c, dwq1)
        tl.store(row + HALF + c, dwq2)
        tl.store(row + 2 * HALF + c, dwk1)
        tl.store(row + 3 * HALF + c, dwk2)


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qk, q_weight, k_weight, cos, sin, q_heads: int, eps: float):
        tokens, heads, dim = qk.shape
        kv_heads = heads - q_heads
        q = torch.empty((tokens, q_heads, dim), dtype=qk.dtype, device=qk.device)
        k = torch.empty((tokens, kv_heads, dim), dtype=qk.dtype, device=qk.device)
        cos, sin = cos.reshape(-1, dim).contiguous(), sin.reshape(-1, dim).contiguous()
        if tokens % cos.shape[0]:
            raise ValueError(f"qk_norm_rope: {tokens} tokens are not a whole number of the {cos.shape[0]} rotary rows")
        rows = tokens * heads
        round_normed = qk.dtype != torch.float32
        if rows:
            _forward_kernel[(triton.cdiv(rows, ROWS),)](qk, q_weight, k_weight, cos, sin, q, k, rows, heads, q_heads,
                                                       kv_heads, qk.stride(0), cos.shape[0], eps, HALF=dim // 2,
                                                       BLOCK_R=ROWS, ROUND_NORMED=round_normed, num_warps=4)
        ctx.save_for_backward(qk, q_weight, k_weight, cos, sin)
        ctx.q_heads, ctx.eps, ctx.round_normed = q_heads, eps, round_normed
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):
        qk, q_weight, k_weight, cos, sin = ctx.saved_tensors
        tokens, heads, dim = qk.shape
        q_heads = ctx.q_heads
        dq = torch.zeros(tokens, q_heads, dim, dtype=qk.dtype, device=qk.device) if dq is None else dq.contiguous()
        dk = (torch.zeros(tokens, heads - q_heads, dim, dtype=qk.dtype, device=qk.device) if dk is None
              else dk.contiguous())
        rows = tokens * heads
        weight_grad = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        dx = torch.empty((tokens, heads, dim), dtype=qk.dtype, device=qk.device)
        programs, per_program = backward_grid(triton.cdiv(rows, ROWS), qk.device) if rows else (0, 0)
        partial = (torch.empty if rows else torch.zeros)((max(programs, 1), 2 * dim) if weight_grad else (1,),
                                                          dtype=torch.float32, device=qk.device)
        if rows:
            _backward_kernel[(programs,)](dq, dk, qk, q_weight, k_weight, cos, sin, dx, partial, rows, heads, q_heads,
                                          heads - q_heads, qk.stride(0), cos.shape[0], ctx.eps, per_program,
                                          HALF=dim // 2, BLOCK_R=ROWS, ROUND_NORMED=ctx.round_normed,
                                          WEIGHT_GRAD=weight_grad, num_warps=4)
        dq_w = dk_w = None
        if weight_grad:
            both = partial.sum(0).view(2, dim)
            dq_w, dk_w = both[0].to(q_weight.dtype), both[1].to(k_weight.dtype)
        return dx, dq_w, dk_w, None, None, None, None


def supported(head_dim: int) -> bool:
    """The kernels hold each half of a head in one block (a power of two), and round the normalised values as the
    q/k norms do for heads narrower than models/norms.NARROWEST."""
    from .norms import NARROWEST

    half = head_dim // 2
    return head_dim % 2 == 0 and half >= 1 and half & (half - 1) == 0 and head_dim < NARROWEST


def qk_norm_rope(qk: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, q_heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """qk [tokens, q_heads + kv_heads, D] (its heads adjacent and each contiguous; tokens may be any stride apart,
    as in a stacked q/k/v output), cos/sin [tokens, D], or the rows of one sequence that a batch of them
    shares ([1, T, D] for tokens = B x T) -> (q [tokens, q_heads, D],
    k [tokens, kv_heads, D]): each head RMS-normalised with its norm's weight (Llama's form) and rotated (RoPE, the
    halves rotated against each other), in qk's dtype (module docstring)."""
    if qk.stride(2) != 1 or qk.stride(1) != qk.shape[2] or not supported(qk.shape[2]):
        raise ValueError(f"qk_norm_rope needs adjacent contiguous heads of a power-of-two half width, got shape "
                         f"{tuple(qk.shape)} strides {qk.stride()}")
    return _QKNormRope.apply(qk, q_weight, k_weight, cos, sin, q_heads, eps)
