"""The attention heads' q/k RMSNorm and the rotary embedding in one Triton kernel, for Qwen3-style attention
(q_norm and k_norm over each head's features, then RoPE) on a training step on CUDA.

Unfused, each layer ran the q norm, the k norm and Liger's RoPE as three kernels forward and three backward, each
reading and writing all of q and k, with an autograd node and a Python launch each. Here one forward kernel per
tensor reads the projection's output once and writes the rotated heads, and one backward kernel per tensor
rotates the incoming gradient back, writes the input gradient and reduces its share of the norm's weight
gradient (partial rows summed by PyTorch, as models/rms_norm_triton.py does).

Numerics are those of the unfused path, rounding for rounding, under autocast (fp32 angles): the norm as
models/norms.py runs it for the heads (Liger's form: normalised in fp32, rounded to the input's dtype, scaled by
the weight, rounded again), then Liger's RoPE (the halves rotated in fp32, stored in the input's dtype); backward,
Liger's inverse rotation stored in the gradient's dtype, then the norm's backward. With bf16 angles (pure bf16)
Liger rotates in bf16 arithmetic; here the rotation stays in fp32 and is rounded once, as transformers' own RoPE
of a bf16 input with fp32 angles would be: a difference within bf16's rounding.

`use_qk_norm_rope` gives such attention modules `_attention_forward`, which takes this path on a training
forward (CUDA, gradients on, no cache, full-width rotary) and the module's own forward otherwise.
"""

from __future__ import annotations

import functools
import sys

import torch
import triton
import triton.language as tl

from .rms_norm_triton import backward_grid, tile_shape


@triton.jit
def _forward_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, rstd_ptr, rows, heads, cos_rows, eps,
                    HALF: tl.constexpr, BLOCK_R: tl.constexpr):
    """x [rows = tokens x heads, 2*HALF]: each row normalised and scaled, then rotated by its token's angles."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.arange(0, HALF)
    row_ok = r < rows
    ok = row_ok[:, None]
    first = r[:, None] * (2 * HALF) + c[None, :]
    x1 = tl.load(x_ptr + first, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + first + HALF, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    dtype = x_ptr.dtype.element_ty
    w1 = tl.load(w_ptr + c).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + c).to(tl.float32)
    y1 = ((x1 * rstd[:, None]).to(dtype).to(tl.float32) * w1[None, :]).to(dtype)
    y2 = ((x2 * rstd[:, None]).to(dtype).to(tl.float32) * w2[None, :]).to(dtype)
    angle = ((r // heads) % cos_rows)[:, None] * (2 * HALF) + c[None, :]
    cos = tl.load(cos_ptr + angle, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + angle, mask=ok, other=0.0).to(tl.float32)
    a1, a2 = y1.to(tl.float32), y2.to(tl.float32)
    tl.store(y_ptr + first, (a1 * cos - a2 * sin).to(dtype), mask=ok)
    tl.store(y_ptr + first + HALF, (a2 * cos + a1 * sin).to(dtype), mask=ok)
    tl.store(rstd_ptr + r, rstd, mask=row_ok)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, cos_ptr, sin_ptr, rstd_ptr, dx_ptr, dw_ptr, rows, heads, cos_rows,
                     tiles_per_program, HALF: tl.constexpr, BLOCK_R: tl.constexpr, WEIGHT_GRAD: tl.constexpr):
    program = tl.program_id(0)
    c = tl.arange(0, HALF)
    dtype = x_ptr.dtype.element_ty
    w1 = tl.load(w_ptr + c).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + c).to(tl.float32)
    dw1 = tl.zeros([HALF], dtype=tl.float32)
    dw2 = tl.zeros([HALF], dtype=tl.float32)
    for i in range(tiles_per_program):
        r = ((program * tiles_per_program + i) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        ok = (r < rows)[:, None]
        first = r[:, None] * (2 * HALF) + c[None, :]
        angle = ((r // heads) % cos_rows)[:, None] * (2 * HALF) + c[None, :]
        cos = tl.load(cos_ptr + angle, mask=ok, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + angle, mask=ok, other=0.0).to(tl.float32)
        g1 = tl.load(dy_ptr + first, mask=ok, other=0.0).to(tl.float32)
        g2 = tl.load(dy_ptr + first + HALF, mask=ok, other=0.0).to(tl.float32)
        d1 = (g1 * cos + g2 * sin).to(dy_ptr.dtype.element_ty).to(tl.float32)  # the rotation's gradient, stored
        d2 = (g2 * cos - g1 * sin).to(dy_ptr.dtype.element_ty).to(tl.float32)
        rstd = tl.load(rstd_ptr + r, mask=r < rows, other=0.0)[:, None]
        n1 = tl.load(x_ptr + first, mask=ok, other=0.0).to(tl.float32) * rstd
        n2 = tl.load(x_ptr + first + HALF, mask=ok, other=0.0).to(tl.float32) * rstd
        if WEIGHT_GRAD:
            dw1 += tl.sum(d1 * n1.to(dtype).to(tl.float32), axis=0)
            dw2 += tl.sum(d2 * n2.to(dtype).to(tl.float32), axis=0)
        dn1, dn2 = d1 * w1[None, :], d2 * w2[None, :]
        mean = (tl.sum(dn1 * n1, axis=1) + tl.sum(dn2 * n2, axis=1)) / (2 * HALF)
        tl.store(dx_ptr + first, (rstd * (dn1 - n1 * mean[:, None])).to(dtype), mask=ok)
        tl.store(dx_ptr + first + HALF, (rstd * (dn2 - n2 * mean[:, None])).to(dtype), mask=ok)
    if WEIGHT_GRAD:
        tl.store(dw_ptr + program * (2 * HALF) + c, dw1)
        tl.store(dw_ptr + program * (2 * HALF) + HALF + c, dw2)


def _forward(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float):
    """x [..., heads, D] -> (its rows [tokens x heads, D], the rotated rows, rstd per row)."""
    dim, heads = x.shape[-1], x.shape[-2]
    rows_in = x.reshape(-1, dim).contiguous()
    rows = rows_in.shape[0]
    out = torch.empty_like(rows_in)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block_r, _, warps = tile_shape(dim)
    _forward_kernel[(triton.cdiv(rows, block_r),)](rows_in, weight, cos, sin, out, rstd, rows, heads, cos.shape[0],
                                                   eps, HALF=dim // 2, BLOCK_R=block_r, num_warps=warps)
    return rows_in, out, rstd


def _backward(dy, rows_in, rstd, weight, cos, sin, heads: int, weight_grad: bool):
    rows, dim = rows_in.shape
    dy = dy.reshape(rows, dim).contiguous()
    block_r, _, warps = tile_shape(dim)
    programs, per_program = backward_grid(rows, dim, rows_in.device)
    dx = torch.empty_like(rows_in)
    partial = torch.empty((programs, dim) if weight_grad else (1,), dtype=torch.float32, device=rows_in.device)
    _backward_kernel[(programs,)](dy, rows_in, weight, cos, sin, rstd, dx, partial, rows, heads, cos.shape[0],
                                  per_program, HALF=dim // 2, BLOCK_R=block_r, WEIGHT_GRAD=weight_grad,
                                  num_warps=warps)
    return dx, partial.sum(0).to(weight.dtype) if weight_grad else None


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, q_weight, k_weight, cos, sin, q_eps: float, k_eps: float):
        q_rows, q_out, q_rstd = _forward(q, q_weight, cos, sin, q_eps)
        k_rows, k_out, k_rstd = _forward(k, k_weight, cos, sin, k_eps)
        ctx.save_for_backward(q_rows, q_rstd, k_rows, k_rstd, q_weight, k_weight, cos, sin)
        ctx.shapes = (q.shape, k.shape)
        return q_out.view(q.shape), k_out.view(k.shape)

    @staticmethod
    def backward(ctx, dq, dk):
        q_rows, q_rstd, k_rows, k_rstd, q_weight, k_weight, cos, sin = ctx.saved_tensors
        (q_shape, k_shape), needs = ctx.shapes, ctx.needs_input_grad
        dq, dwq = _backward(dq, q_rows, q_rstd, q_weight, cos, sin, q_shape[-2], needs[2])
        dk, dwk = _backward(dk, k_rows, k_rstd, k_weight, cos, sin, k_shape[-2], needs[3])
        return dq.view(q_shape), dk.view(k_shape), dwq, dwk, None, None, None, None


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_norm: torch.nn.Module, k_norm: torch.nn.Module,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, D], k [B, T, Hkv, D] (the projections' outputs, heads not yet transposed), cos/sin [B or 1, T,
    D] -> (q, k) normalised by q_norm/k_norm (Llama-form RMSNorms: weight, variance_epsilon) and rotated, in the
    same layout."""
    dim = q.shape[-1]
    cos, sin = (t.reshape(-1, dim).contiguous() for t in (cos, sin))
    return _QKNormRope.apply(q, k, q_norm.weight, k_norm.weight, cos, sin, q_norm.variance_epsilon,
                             k_norm.variance_epsilon)


def _fusable(attn, hidden_states: torch.Tensor, position_embeddings, kwargs: dict) -> bool:
    """Whether this attention call takes the fused path: a training forward on the Triton path, no cache, and
    rotary angles over the whole head whose token count divides the batch's."""
    from .norms import _on_triton  # the CPU tests switch it on for Triton's interpreter

    if (not _on_triton(hidden_states) or not torch.is_grad_enabled() or position_embeddings is None
            or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None):
        return False
    cos = position_embeddings[0]
    tokens = hidden_states.shape[:-1].numel()
    return cos.shape[-1] == attn.head_dim and cos.dim() == 3 and tokens % cos.shape[:-1].numel() == 0


def _attention_forward(attn, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, **kwargs):
    """A Qwen3-style attention's forward with the q/k norms and RoPE fused (transformers' own steps otherwise)."""
    if not _fusable(attn, hidden_states, position_embeddings, kwargs):
        return type(attn).forward(attn, hidden_states, position_embeddings=position_embeddings,
                                  attention_mask=attention_mask, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kwargs.pop("cache", None), kwargs.pop("past_key_values", None)
    shape = (*hidden_states.shape[:-1], -1, attn.head_dim)
    q, k = qk_norm_rope(attn.q_proj(hidden_states).view(shape), attn.k_proj(hidden_states).view(shape),
                        attn.q_norm, attn.k_norm, *position_embeddings)
    v = attn.v_proj(hidden_states).view(shape)
    eager = sys.modules[type(attn).__module__].eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)
    if hasattr(attn, "sliding_window"):
        kwargs["sliding_window"] = attn.sliding_window
    out, weights = interface(attn, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask,
                             dropout=0.0 if not attn.training else attn.attention_dropout, scaling=attn.scaling,
                             **kwargs)
    return attn.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


QK_NORM_ATTENTIONS = frozenset({"Qwen3Attention", "Qwen3VLTextAttention"})


def use_qk_norm_rope(model: torch.nn.Module, llama_form: set[int]) -> int:
    """Give each attention of QK_NORM_ATTENTIONS whose q_norm and k_norm are in `llama_form` (ids of norms
    models/norms.py replaced) the fused forward; returns how many."""
    changed = 0
    for attn in model.modules():
        if (type(attn).__name__ in QK_NORM_ATTENTIONS and id(getattr(attn, "q_norm", None)) in llama_form
                and id(getattr(attn, "k_norm", None)) in llama_form and _power_of_two(attn.head_dim // 2)):
            attn.forward = functools.partial(_attention_forward, attn)
            changed += 1
    return changed


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
