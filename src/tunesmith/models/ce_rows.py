"""One GPU kernel for the cross-entropy of a chunk of logits: each row's NLL, and d(NLL)/d(logits) written over
the logits in place.

models/linear_ce.py computes a chunk's logits with one matmul and then needs, per row, log-sum-exp, the NLL of
the target and the softmax minus the target's one-hot. In eager PyTorch that is an fp32 copy of the chunk and
five more passes over it (logsumexp, gather, subtract, exp, scale, cast back): at a 151k vocabulary about 19 GB
of memory traffic per 2,048 rows, most of the output layer's time that is not matmul. This kernel reads each
row twice in its own dtype (online max and sum, then the gradient) and writes it once.

Numerics are the eager path's: the logits as the matmul rounded them, everything else in fp32, the gradient
rounded to the logits' dtype. CUDA only (Triton); `available()` says whether it can run.
"""

from __future__ import annotations

import functools

import torch

_BLOCK = 4096  # columns per iteration; a 151,936-token row is 38 of them


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def nll_and_softmax_grad(logits_ptr, targets_ptr, nll_ptr, stride, vocab, BLOCK: tl.constexpr,
                             WRITE_GRAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        target = tl.load(targets_ptr + row)
        counted = target >= 0
        safe_target = tl.where(counted, target, 0)
        target_logit = tl.load(base + safe_target).to(tl.float32)  # before the row is overwritten
        # Online max and sum per lane; a lane masked in every block keeps -1e30 and adds nothing below.
        lane_max = tl.full([BLOCK], -1e30, tl.float32)
        lane_sum = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < vocab, other=-1e30).to(tl.float32)
            new_max = tl.maximum(lane_max, x)
            lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.exp(x - new_max)
            lane_max = new_max
        row_max = tl.max(lane_max, 0)
        lse = row_max + tl.log(tl.sum(lane_sum * tl.exp(lane_max - row_max), 0))
        tl.store(nll_ptr + row, tl.where(counted, lse - target_logit, 0.0))
        if WRITE_GRAD:
            scale = tl.where(counted, 1.0, 0.0)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(base + cols, mask=cols < vocab, other=0.0).to(tl.float32)
                grad = tl.exp(x - lse) - tl.where(cols == safe_target, 1.0, 0.0)
                tl.store(base + cols, (grad * scale).to(logits_ptr.dtype.element_ty), mask=cols < vocab)

    return nll_and_softmax_grad


def available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        _kernel()
    except ImportError:
        return False
    return True


def nll_and_grad_(logits_RV: torch.Tensor, targets_R: torch.Tensor, *, grad: bool) -> torch.Tensor:
    """Per-row NLL (fp32, 0 where the target is negative); with `grad`, logits_RV becomes d(NLL sum)/d(logits)
    in its own dtype (softmax minus the one-hot, zero rows for uncounted targets)."""
    if logits_RV.stride(1) != 1:
        raise ValueError("nll_and_grad_ needs rows contiguous in memory")
    rows, vocab = logits_RV.shape
    nll_R = torch.empty(rows, dtype=torch.float32, device=logits_RV.device)
    if rows:
        _kernel()[(rows,)](logits_RV, targets_R, nll_R, logits_RV.stride(0), vocab, BLOCK=_BLOCK,
                           WRITE_GRAD=grad, num_warps=8)
    return nll_R
