"""The output layer and its cross-entropy in one pass, over a few large chunks of tokens.

The loss of a causal LM needs logits over the whole vocabulary for every token ([tokens x vocab],
the largest activation of a small-model SFT step). This computes the NLL sum and both gradients
(hidden states and output weight) chunk by chunk inside the forward, so the logits of one chunk are
the only ones that exist, and the backward only scales the saved gradients.

Liger's kernel does the same with chunks sized to the hidden states (128 rows for a 151k
vocabulary at hidden 2048): every chunk then re-reads and re-writes the whole fp32 weight gradient,
so the head runs memory-bound (a fifth of a Qwen3-1.7B step on an H200). Here a chunk is as many
rows as fit in a fixed logits budget (2,048 rows at that shape), a handful of large matmuls per
micro-batch, and only for the tokens whose target is counted.

Numerics: the matmuls run in the compute dtype (the autocast dtype under autocast, else the
inputs'), the log-sum-exp, the NLL and the softmax in fp32, the weight gradient accumulates in fp32.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
LOGITS_BUDGET_BYTES = 2 * 1024**3  # per chunk: fp32 logits plus their compute-dtype copy


def chunk_rows(vocab: int, compute_dtype: torch.dtype, budget: int = LOGITS_BUDGET_BYTES) -> int:
    per_row = vocab * (4 + torch.finfo(compute_dtype).bits // 8)
    return max(1, budget // per_row)


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, rows: int, compute_dtype: torch.dtype):
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=compute_dtype, device=hidden.device) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], rows):
            x = hidden[start:start + rows].to(compute_dtype)
            t = targets[start:start + rows]
            logits = (x @ w.T).float()
            lse = torch.logsumexp(logits, dim=-1)
            valid = t != IGNORE_INDEX
            safe_t = torch.where(valid, t, 0).unsqueeze(1)
            total += ((lse - logits.gather(1, safe_t).squeeze(1)) * valid).sum()
            if grad_hidden is None and grad_weight is None:
                continue
            probs = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
            probs.scatter_add_(1, safe_t, -valid.unsqueeze(1).float())  # minus one at each counted target
            g = probs.mul_(valid.unsqueeze(1)).to(compute_dtype)  # d(NLL sum)/d(logits)
            del logits, probs
            if grad_hidden is not None:
                grad_hidden[start:start + rows] = g @ w
            if grad_weight is not None:
                grad_weight += (g.T @ x).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        gh = (grad_hidden * grad_total).to(hidden_dtype) if grad_hidden is not None else None
        gw = (grad_weight * grad_total).to(weight_dtype) if grad_weight is not None else None
        return gh, gw, None, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """sum over counted targets of -log softmax(hidden @ weight.T)[target]; targets == -100 are not counted.
    hidden [N, H], weight [V, H], targets [N]; an fp32 scalar. Only the counted rows reach the output layer
    (prompt tokens of SFT never need their logits); finding them is the one host synchronisation."""
    counted = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    hidden, targets = hidden.index_select(0, counted), targets.index_select(0, counted)
    dtype = _compute_dtype(hidden)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_rows(weight.shape[0], dtype), dtype)


class ChunkedLinearCrossEntropy(torch.nn.Module):
    """The loss object `models.kernels.install_loss_head` takes: loss(weight, hidden, targets) -> NLL sum."""

    def forward(self, weight, hidden, targets):
        return linear_cross_entropy_sum(hidden, weight, targets)
