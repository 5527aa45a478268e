"""RMSNorm forward and backward as two Triton kernels, for the norms of a training step on CUDA.

Why our own: on issue 15's workload (Qwen3-1.7B, ~8k tokens a micro-batch) PyTorch's fused RMSNorm backward
reduces the weight gradient over the rows in a second, slow kernel (110 us a call over the hidden size, 2.4x
what its bytes need), and Liger's backward over the q/k heads' 128 features takes ~100 us for ~20 us of bytes
(benchmarks/results/2026-12-04-autocast-linear-loop-profile.txt). Here one backward kernel reads each row once,
writes its input gradient and adds its share of the weight gradient to one partial row per program; the
partial rows (a few hundred) are summed by PyTorch. The q/k norms read their input where it lies, a view of the
stacked q/k/v projection's output (models/fused_projections.py), rather than a contiguous copy of it.

Numerics, Llama's form (no weight offset): the row is read in fp32, rstd = 1/sqrt(mean(x^2) + eps), n = x * rstd,
y = n * w computed in fp32 and rounded once to the output dtype. `round_normed` rounds n to the input's half
dtype before the weight, as transformers and Liger do for a half-precision input. The output dtype may differ
from the input's: under bf16 autocast a pre-norm over the fp32 residual stream can write bf16 straight away,
which is the cast every linear reading it would make (the same value: one rounding of the fp32 product).

`add_rms_norm` also adds a residual branch first (a decoder layer's `residual + attention output` before its
second norm): one kernel writes the sum and its norm, and one backward kernel writes both inputs' gradients (the
residual's in its dtype, the branch's in its own: the cast the add's backward made in a separate, slow kernel).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

TILE_ELEMENTS = 8192  # elements a program holds at once: BLOCK_R rows x BLOCK_N features


@triton.jit
def _input_offsets(r, c, cols, heads, group_stride):
    """Where row r's features lie in an input of groups of `heads` adjacent rows, `group_stride` apart (1 and
    cols for a contiguous input)."""
    return ((r // heads) * group_stride + (r % heads) * cols)[:, None] + c[None, :]


@triton.jit
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, rows, cols, heads, group_stride, eps,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_NORMED: tl.constexpr):
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.arange(0, BLOCK_N)
    row_ok, col_ok = r < rows, c < cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = r[:, None] * cols + c[None, :]
    x = tl.load(x_ptr + _input_offsets(r, c, cols, heads, group_stride), mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / cols + eps)
    normed = x * rstd[:, None]
    if ROUND_NORMED:
        normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + c, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (normed * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + r, rstd, mask=row_ok)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, ds_ptr, db_ptr, rows, cols, heads, group_stride,
                     tiles_per_program, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ROUND_NORMED: tl.constexpr,
                     WEIGHT_GRAD: tl.constexpr, ADD: tl.constexpr):
    """dx (and the weight gradient's partial row of this program) from dy; with ADD (add_rms_norm) x is the sum,
    whose own gradient ds joins dx, and the branch's gradient db is the same total in the branch's dtype."""
    program = tl.program_id(0)
    c = tl.arange(0, BLOCK_N)
    col_ok = c < cols
    w = tl.load(w_ptr + c, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in range(tiles_per_program):
        r = ((program * tiles_per_program + i) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        row_ok = r < rows
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = r[:, None] * cols + c[None, :]
        x = tl.load(x_ptr + _input_offsets(r, c, cols, heads, group_stride), mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + r, mask=row_ok, other=0.0)
        normed = x * rstd[:, None]
        if WEIGHT_GRAD:
            if ROUND_NORMED:
                dw += tl.sum(dy * normed.to(x_ptr.dtype.element_ty).to(tl.float32), axis=0)
            else:
                dw += tl.sum(dy * normed, axis=0)
        dn = dy * w[None, :]
        mean_dn_n = tl.sum(dn * normed, axis=1) / cols
        dx = rstd[:, None] * (dn - normed * mean_dn_n[:, None])
        if ADD:
            dx += tl.load(ds_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            tl.store(db_ptr + offsets, dx.to(db_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if WEIGHT_GRAD:
        tl.store(dw_ptr + program * cols + c, dw, mask=col_ok)


@triton.jit
def _add_forward_kernel(r_ptr, b_ptr, w_ptr, s_ptr, y_ptr, rstd_ptr, rows, cols, eps,
                        BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.arange(0, BLOCK_N)
    row_ok, col_ok = r < rows, c < cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = r[:, None] * cols + c[None, :]
    total = (tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
             + tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
    total = total.to(s_ptr.dtype.element_ty)  # the sum as the residual stream holds it (rounded in pure bf16)
    tl.store(s_ptr + offsets, total, mask=mask)
    x = total.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / cols + eps)
    w = tl.load(w_ptr + c, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + r, rstd, mask=row_ok)


def _blocks(cols: int) -> tuple[int, int, int]:
    """(rows a tile, features padded to a power of two, warps)."""
    block_n = triton.next_power_of_2(cols)
    block_r = max(1, TILE_ELEMENTS // block_n)
    return block_r, block_n, 8 if block_r * block_n >= 4096 else 4


@functools.lru_cache(maxsize=8)
def _programs(device_index: int) -> int:
    """Backward programs: a few per multiprocessor, so the partial weight-gradient rows stay few."""
    return 4 * torch.cuda.get_device_properties(device_index).multi_processor_count


def backward_grid(tiles: int, device: torch.device) -> tuple[int, int]:
    """(programs, tiles a program) for a backward kernel over `tiles` tiles of rows that writes one partial
    weight-gradient row per program (here, and in models/qk_norm_rope.py)."""
    wanted = _programs(device.index or 0) if device.type == "cuda" else 4
    per_program = triton.cdiv(tiles, min(tiles, wanted))
    return triton.cdiv(tiles, per_program), per_program


def _backward_grid(rows: int, cols: int, device: torch.device) -> tuple[int, int]:
    """(programs, tiles a program) for a backward kernel over `rows`."""
    return backward_grid(triton.cdiv(rows, _blocks(cols)[0]), device)


def _rows_in_place(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x's rows of its last dimension as the kernels read them: (a view or a contiguous copy, heads, group
    stride). A [..., H, D] view of a wider tensor (q or k in models/fused_projections' stacked q/k/v output) is
    read where it lies, as groups of H adjacent rows; other layouts are copied."""
    cols = x.shape[-1]
    if x.is_contiguous():
        return x.reshape(-1, cols), 1, cols
    if x.dim() >= 3 and x.stride(-1) == 1 and (x.stride(-2) == cols or x.shape[-2] == 1):
        try:
            grouped = x.view(-1, x.shape[-2], cols)
        except RuntimeError:  # the leading dimensions do not merge into one stride
            grouped = None
        if grouped is not None:
            return grouped, x.shape[-2], grouped.stride(0)
    return x.reshape(-1, cols).contiguous(), 1, cols


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float, out_dtype: torch.dtype, round_normed: bool):
        shape, cols = x.shape, x.shape[-1]
        x_rows, heads, group_stride = _rows_in_place(x)
        rows = x.numel() // cols
        y = torch.empty((rows, cols), dtype=out_dtype, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block_r, block_n, warps = _blocks(cols)
        _forward_kernel[(triton.cdiv(rows, block_r),)](x_rows, weight, y, rstd, rows, cols, heads, group_stride, eps,
                                                       BLOCK_R=block_r, BLOCK_N=block_n, ROUND_NORMED=round_normed,
                                                       num_warps=warps)
        ctx.save_for_backward(x_rows, weight, rstd)
        ctx.shape, ctx.round_normed, ctx.layout = shape, round_normed, (heads, group_stride)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x_rows, weight, rstd = ctx.saved_tensors
        cols = x_rows.shape[-1]
        rows = x_rows.numel() // cols
        dy2 = dy.reshape(-1, cols).contiguous()
        block_r, block_n, warps = _blocks(cols)
        programs, per_program = _backward_grid(rows, cols, x_rows.device)
        weight_grad = ctx.needs_input_grad[1]
        dx = torch.empty((rows, cols), dtype=x_rows.dtype, device=x_rows.device)
        partial = torch.empty((programs, cols) if weight_grad else (1,), dtype=torch.float32, device=dx.device)
        _backward_kernel[(programs,)](dy2, x_rows, weight, rstd, dx, partial, dx, dx, rows, cols, *ctx.layout,
                                      per_program, BLOCK_R=block_r, BLOCK_N=block_n, ROUND_NORMED=ctx.round_normed,
                                      WEIGHT_GRAD=weight_grad, ADD=False, num_warps=warps)
        dw = partial.sum(0).to(weight.dtype) if weight_grad else None
        return dx.view(ctx.shape), dw, None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out_dtype: torch.dtype | None = None,
             round_normed: bool = False) -> torch.Tensor:
    """Llama-form RMSNorm of the last dimension through the Triton kernels (module docstring); `out_dtype`
    defaults to the input's."""
    return _RMSNorm.apply(x, weight, eps, out_dtype or x.dtype, round_normed)


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, branch, weight, eps: float, out_dtype: torch.dtype):
        shape, cols = residual.shape, residual.shape[-1]
        r2, b2 = (t.reshape(-1, cols).contiguous() for t in (residual, branch))
        rows = r2.shape[0]
        total = torch.empty_like(r2)
        y = torch.empty((rows, cols), dtype=out_dtype, device=r2.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=r2.device)
        block_r, block_n, warps = _blocks(cols)
        _add_forward_kernel[(triton.cdiv(rows, block_r),)](r2, b2, weight, total, y, rstd, rows, cols, eps,
                                                           BLOCK_R=block_r, BLOCK_N=block_n, num_warps=warps)
        ctx.save_for_backward(total, weight, rstd)
        ctx.shape, ctx.branch_dtype = shape, branch.dtype
        return total.view(shape), y.view(shape)

    @staticmethod
    def backward(ctx, d_total, dy):
        total, weight, rstd = ctx.saved_tensors
        rows, cols = total.shape
        d_total = torch.zeros_like(total) if d_total is None else d_total.reshape(-1, cols).contiguous()
        dy = torch.zeros_like(total) if dy is None else dy.reshape(-1, cols).contiguous()
        block_r, block_n, warps = _blocks(cols)
        programs, per_program = _backward_grid(rows, cols, total.device)
        weight_grad = ctx.needs_input_grad[2]
        d_residual = torch.empty_like(total)
        d_branch = torch.empty((rows, cols), dtype=ctx.branch_dtype, device=total.device)
        partial = torch.empty((programs, cols) if weight_grad else (1,), dtype=torch.float32, device=total.device)
        _backward_kernel[(programs,)](dy, total, weight, rstd, d_residual, partial, d_total, d_branch, rows, cols,
                                      1, cols, per_program, BLOCK_R=block_r, BLOCK_N=block_n, ROUND_NORMED=False,
                                      WEIGHT_GRAD=weight_grad, ADD=True, num_warps=warps)
        dw = partial.sum(0).to(weight.dtype) if weight_grad else None
        return d_residual.view(ctx.shape), d_branch.view(ctx.shape), dw, None, None


def add_rms_norm(residual: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + branch, its Llama-form RMSNorm) through the Triton kernels: the sum in the residual's dtype,
    the norm in `out_dtype` (default the residual's)."""
    return _AddRMSNorm.apply(residual, branch, weight, eps, out_dtype or residual.dtype)
