"""Shared pieces of dpo / kto: sequence log-probs from the logits, and the reference pre-pass.

Batches of these stages hold two halves (chosen then rejected, or examples then
their mismatched KL twins), one sequence per row, so per-row sums are per-sequence.
"""

from __future__ import annotations

import torch

from ..models.forward import ModelOutputs
from .base import PrePass
from .losses import IGNORE_INDEX, sequence_logps, token_logps

# Reference modes in which the engine runs a reference policy each step (precomputed ones come with the data).
LIVE_REFERENCES = ("copy", "adapters_off")


def batch_logps(logits_BTV: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (sequence) summed and averaged response log-probs, and each row's label-token count."""
    logps_BT = token_logps(logits_BTV, batch.targets_BT)
    mask_BT = batch.targets_BT != IGNORE_INDEX
    total_B, mean_B = sequence_logps(logps_BT, mask_BT)
    return total_B, mean_B, mask_BT.sum(-1)


def response_logit_means(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Per-row mean of the logits over the response positions and the vocabulary, in fp32, detached: the
    logits/chosen and logits/rejected of dpo (LLaMA-Factory's mean also covers the prompt and the padding)."""
    with torch.no_grad():
        mask_BT = (targets_BT != IGNORE_INDEX).to(torch.float32)
        per_token_BT = logits_BTV.detach().mean(-1, dtype=torch.float32)
        return (per_token_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1.0)


def sequence_logps_fn(average: bool):
    """outputs -> per-row summed (or averaged) log-probs, for pre-passes and the precomputed reference."""

    def fn(outputs: ModelOutputs, batch) -> torch.Tensor:
        total, mean, _ = batch_logps(outputs.logits_BTV, batch)
        return mean if average else total

    return fn


def reference_prepass(mode: str, average: bool) -> list[PrePass]:
    """The reference log-probs per row (batch.extra["ref_logps_B"]) when a live reference runs each step."""
    if mode not in LIVE_REFERENCES:
        return []
    return [PrePass("ref_logps_B", "logits", sequence_logps_fn(average), reference=True)]


def reference_or_zeros(batch, like: torch.Tensor) -> torch.Tensor:
    """The batch's reference log-probs per row; zeros for a reference-free loss."""
    ref = batch.extra.get("ref_logps_B")
    return torch.zeros_like(like) if ref is None else ref.to(like.device)
