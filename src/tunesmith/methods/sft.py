"""sft and pt: next-token cross-entropy on the supervised tokens.

pt differs from sft only in the data (every token is a label), so both stages
use this loss. With Liger installed and enabled, the fused linear+CE kernel
computes the loss from hidden states without materialising the logits.
"""

from __future__ import annotations

import torch

from ..data.collate import SFTBatch, collate_rows
from ..models.processing import model_inputs
from .base import LossOutput
from .losses import causal_lm_loss, token_nll


def forward_logits(model, batch: SFTBatch) -> torch.Tensor:
    return model(**model_inputs(model, batch)).logits


def sft_loss(model, batch: SFTBatch, num_label_tokens: int, fused_ce=None) -> LossOutput:
    """Loss of one micro-batch, normalised by the label tokens of the whole optimiser step."""
    if fused_ce is not None:
        nll_sum = fused_ce(model, batch)
        return LossOutput(nll_sum / num_label_tokens, {"nll": float(nll_sum.detach())}, batch.num_label_tokens)
    nll_BT = token_nll(forward_logits(model, batch), batch.targets_BT)
    return LossOutput(causal_lm_loss(nll_BT, num_label_tokens), {"nll": float(nll_BT.detach().sum())}, batch.num_label_tokens)


class SFTMethod:
    collate = staticmethod(collate_rows)

    def __init__(self, stage: str, fused_ce=None):
        self.stage = stage
        self.fused_ce = fused_ce

    def units(self, batch: SFTBatch) -> int:
        return batch.num_label_tokens

    def loss(self, model, batch: SFTBatch, norm: int) -> LossOutput:
        return sft_loss(model, batch, norm, self.fused_ce)

    def prepare(self, runner) -> None:
        pass
