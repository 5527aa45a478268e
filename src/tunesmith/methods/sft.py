"""sft and pt: next-token cross-entropy on the supervised tokens.

pt differs from sft only in the data (every token is a label), so both stages
use this loss. With Liger installed and enabled, the engine's "nll" forward
returns the summed NLL from the fused linear+CE head without materialising the logits.
"""

from __future__ import annotations

from ..data.collate import SFTBatch, collate_rows
from ..models.forward import ModelOutputs
from .base import LossOutput, NoPrePasses
from .losses import causal_lm_loss, token_nll


def sft_loss(outputs: ModelOutputs, batch: SFTBatch, num_label_tokens: int) -> LossOutput:
    """Loss of one micro-batch, normalised by the label tokens of the whole optimiser step."""
    if outputs.nll_sum is not None:
        nll_sum = outputs.nll_sum
        return LossOutput(nll_sum / num_label_tokens, {"nll": float(nll_sum.detach())}, batch.num_label_tokens)
    nll_BT = token_nll(outputs.logits_BTV, batch.targets_BT)
    return LossOutput(causal_lm_loss(nll_BT, num_label_tokens), {"nll": float(nll_BT.detach().sum())},
                      batch.num_label_tokens)


class SFTMethod(NoPrePasses):
    collate = staticmethod(collate_rows)
    outputs = "nll"

    def __init__(self, cfg):
        self.stage = cfg.finetune.stage

    def units(self, batch: SFTBatch) -> int:
        return batch.num_label_tokens

    def loss(self, outputs: ModelOutputs, batch: SFTBatch, stats: dict) -> LossOutput:
        return sft_loss(outputs, batch, stats["units"])
