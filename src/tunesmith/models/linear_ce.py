"""The output layer and its cross-entropy in one pass, over a few large chunks of tokens.

The loss of a causal LM needs logits over the whole vocabulary for every token ([tokens x vocab],
the largest activation of a small-model SFT step). This computes the NLL sum and both gradients
(hidden states and output weight) chunk by chunk inside the forward, so the logits of one chunk are
the only ones that exist, and the backward only scales the saved gradients.

Liger's kernel does the same with chunks sized to the hidden states (128 rows for a 151k
vocabulary at hidden 2048): every chunk then re-reads and re-writes the whole fp32 weight gradient,
so the head runs memory-bound (a fifth of a Qwen3-1.7B step on an H200). Here a chunk is as many
rows as fit in a fixed logits budget (7,064 rows at that shape on CUDA, 2,048 on the eager path), a
handful of large matmuls per micro-batch, and only for the tokens whose target is counted. On CUDA
the per-row log-sum-exp, NLL and softmax gradient run as one kernel over the logits in place
(models/ce_rows.py), and the weight gradient accumulates inside the matmul.

Numerics: the matmuls run in the compute dtype (the autocast dtype under autocast, else the
inputs'), the log-sum-exp, the NLL and the softmax in fp32, the weight gradient accumulates in fp32.
"""

from __future__ import annotations

import torch

from . import ce_rows

IGNORE_INDEX = -100
LOGITS_BUDGET_BYTES = 2 * 1024**3  # per chunk: the logits (and their fp32 copy on the eager path)


def chunk_rows(vocab: int, compute_dtype: torch.dtype, budget: int = LOGITS_BUDGET_BYTES, *,
               fused: bool = False) -> int:
    """Rows per chunk: the fused kernel (models/ce_rows.py) needs only the compute-dtype logits, the eager path
    an fp32 copy as well."""
    per_row = vocab * (torch.finfo(compute_dtype).bits // 8 + (0 if fused else 4))
    return max(1, budget // per_row)


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


def _nll_and_grad_eager(logits: torch.Tensor, t: torch.Tensor, grad: bool):
    """(NLL sum, d(NLL sum)/d(logits) in the logits' dtype or None) in fp32 eager ops."""
    logits32 = logits.float()
    lse = torch.logsumexp(logits32, dim=-1)
    valid = t != IGNORE_INDEX
    safe_t = torch.where(valid, t, 0).unsqueeze(1)
    total = ((lse - logits32.gather(1, safe_t).squeeze(1)) * valid).sum()
    if not grad:
        return total, None
    probs = logits32.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the fp32 logits
    probs.scatter_add_(1, safe_t, -valid.unsqueeze(1).float())  # minus one at each counted target
    return total, probs.mul_(valid.unsqueeze(1)).to(logits.dtype)


def _nll_and_grad_fused(logits: torch.Tensor, t: torch.Tensor, grad: bool):
    from .ce_rows import nll_and_grad_

    return nll_and_grad_(logits, t, grad=grad).sum(), logits if grad else None


_HAS_ADDMM_OUT_DTYPE = "dtype_out" in torch.ops.aten.addmm.overloads()  # torch >= 2.8


def _accumulate_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc fp32 and a, b in the compute dtype: in the matmul's own epilogue on CUDA (no rounded
    product, no fp32 copy of it), else through an fp32 copy of the product."""
    if acc.device.type == "cuda" and a.dtype != torch.float32 and _HAS_ADDMM_OUT_DTYPE:
        torch.ops.aten.addmm.dtype_out(acc, a, b, torch.float32, out=acc)
    else:
        acc += (a @ b).float()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, rows: int, compute_dtype: torch.dtype, fused: bool):
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        nll_and_grad = _nll_and_grad_fused if fused else _nll_and_grad_eager
        w = weight.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=compute_dtype, device=hidden.device) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], rows):
            x = hidden[start:start + rows].to(compute_dtype)
            chunk_total, g = nll_and_grad(x @ w.T, targets[start:start + rows], want_hidden or want_weight)
            total += chunk_total
            if g is None:
                continue
            if grad_hidden is not None:
                torch.mm(g, w, out=grad_hidden[start:start + rows])
            if grad_weight is not None:
                _accumulate_fp32(grad_weight, g.T, x)
            del g
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        gh = (grad_hidden * grad_total).to(hidden_dtype) if grad_hidden is not None else None
        gw = grad_weight.mul_(grad_total).to(weight_dtype) if grad_weight is not None else None
        return gh, gw, None, None, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             counted: torch.Tensor | None = None) -> torch.Tensor:
    """sum over counted targets of -log softmax(hidden @ weight.T)[target]; targets == -100 are not counted.
    hidden [N, H], weight [V, H], targets [N]; an fp32 scalar. Only the counted rows reach the output layer
    (prompt tokens of SFT never need their logits). `counted`: their indices, as the collator found them on the
    CPU; without it they are found here, which makes the host wait for the GPU."""
    if counted is None:
        counted = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    hidden, targets = hidden.index_select(0, counted), targets.index_select(0, counted)
    dtype = _compute_dtype(hidden)
    fused = ce_rows.available(hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_rows(weight.shape[0], dtype, fused=fused),
                                         dtype, fused)


class ChunkedLinearCrossEntropy(torch.nn.Module):
    """The loss object `models.kernels.install_loss_head` takes: loss(weight, hidden, targets, rows) -> NLL sum."""

    def forward(self, weight, hidden, targets, rows=None):
        return linear_cross_entropy_sum(hidden, weight, targets, rows)
