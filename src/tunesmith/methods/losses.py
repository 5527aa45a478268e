"""Pure tensor loss functions, registered by name. No I/O, no backend branches.

Shapes are suffixed: B batch rows, T tokens, V vocabulary. Every loss returns the
*sum* over its tokens divided by a normaliser the loop computed for the whole
optimiser step, so gradient accumulation and data parallelism never change it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

LOSSES: dict[str, Callable] = {}


def register(name: str):
    def wrap(fn):
        LOSSES[name] = fn
        return fn

    return wrap


def token_nll(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood in fp32; 0 where the target is IGNORE_INDEX."""
    flat = F.cross_entropy(
        logits_BTV.float().reshape(-1, logits_BTV.shape[-1]),
        targets_BT.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(targets_BT.shape)


@register("causal_lm")
def causal_lm_loss(nll_BT: torch.Tensor, num_label_tokens: int | torch.Tensor) -> torch.Tensor:
    """Sum of token NLLs over the micro-batch / label tokens of the whole optimiser step."""
    return nll_BT.sum() / num_label_tokens


def per_segment_mean(nll_BT: torch.Tensor, targets_BT: torch.Tensor, segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """Mean NLL of each sample (segment) in a batch: packing-invariance checks and eval."""
    mask = (targets_BT != IGNORE_INDEX) & (segment_ids_BT >= 0)
    seg = segment_ids_BT[mask]
    num = int(segment_ids_BT.max().item()) + 1 if segment_ids_BT.numel() else 0
    sums = torch.zeros(num, dtype=torch.float32, device=nll_BT.device).index_add_(0, seg, nll_BT[mask].float())
    counts = torch.zeros(num, dtype=torch.float32, device=nll_BT.device).index_add_(0, seg, torch.ones_like(seg, dtype=torch.float32))
    return sums / counts.clamp(min=1)
