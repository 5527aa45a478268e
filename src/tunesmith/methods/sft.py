"""sft and pt: next-token cross-entropy on the supervised tokens.

pt differs from sft only in the data (every token is a label), so both stages
use this loss. With Liger installed and enabled, the engine's "nll" forward
returns the summed NLL from the fused linear+CE head without materialising the logits.

use_asft_loss (LLaMA-Factory's ASFT) adds a KL to the reference policy's token distributions, whose logits a
per-micro-batch pre-pass computes (the engine's reference: the starting model).

A mixture-of-experts model's router load-balancing loss (`outputs.aux_loss`, present
in training forwards of models that return one) is added with its coefficient and
logged as `aux_loss`; for dense models the loss is the NLL alone, unchanged.
"""

from __future__ import annotations

import torch

from ..data.collate import SFTBatch, collate_rows
from ..models.forward import ModelOutputs
from .base import LossOutput, NoPrePasses, PrePass
from .losses import IGNORE_INDEX, causal_lm_loss, dft_weights, eaft_weights, reference_kl_sum, token_nll

REFERENCE_LOGITS = "reference_label_logits"  # batch.extra key of ASFT's reference logits


def sft_loss(outputs: ModelOutputs, batch: SFTBatch, num_label_tokens: int, weights=None,
             asft_alpha: float | None = None) -> LossOutput:
    """Loss of one micro-batch, normalised by the label tokens of the whole optimiser step; `weights(logits_BTV,
    nll_BT)`, where given, weights each token's NLL (use_dft_loss, use_eaft_loss: needs logits outputs);
    `asft_alpha`, where given, adds that times each label token's KL from the reference's distribution
    (batch.extra[REFERENCE_LOGITS], use_asft_loss), logged as kl."""
    if outputs.nll_sum is not None:
        nll_sum = outputs.nll_sum
        out = LossOutput(nll_sum / num_label_tokens, {"nll": nll_sum.detach()}, batch.num_label_tokens)
    else:
        nll_BT = token_nll(outputs.logits_BTV, batch.targets_BT)
        weighted_BT = nll_BT if weights is None else nll_BT * weights(outputs.logits_BTV, nll_BT)
        out = LossOutput(causal_lm_loss(weighted_BT, num_label_tokens), {"nll": nll_BT.detach().sum()},
                         batch.num_label_tokens)
        if asft_alpha is not None:
            kl_sum = reference_kl_sum(outputs.logits_BTV, batch.targets_BT, batch.extra[REFERENCE_LOGITS])
            out.loss = out.loss + asft_alpha * kl_sum / num_label_tokens
            out.sums["kl"] = kl_sum.detach()
    if outputs.aux_loss is None:
        return out
    out.loss = out.loss + moe_aux_share(outputs.aux_loss, outputs.aux_loss_coef, batch.num_label_tokens,
                                        num_label_tokens)
    out.sums["aux_loss"] = outputs.aux_loss.detach().float() * batch.num_label_tokens
    return out


def moe_aux_share(aux_loss: torch.Tensor, coef: float, num_label_tokens: int,
                  step_label_tokens: int | torch.Tensor) -> torch.Tensor:
    """This micro-batch's share of the MoE load-balancing term: coef * aux_loss * its label tokens / the step's.

    transformers adds `coef * aux_loss` to a batch's mean loss; weighting each micro-batch's (a mean over
    its own tokens) by its share of the step's label tokens makes the shares of every micro-batch and rank
    add up to coef times their label-token-weighted mean, the same scale whatever the accumulation or
    data-parallel split (the router statistics themselves are per micro-batch, as in transformers).
    """
    return coef * aux_loss.float() * (num_label_tokens / step_label_tokens)


class SFTMethod(NoPrePasses):
    collate = staticmethod(collate_rows)
    outputs = "nll"

    def __init__(self, cfg):
        ft = cfg.finetune
        self.stage = ft.stage
        self.weights = token_weights(ft)
        if self.weights is not None:
            self.outputs = "logits"  # the weights read each token's distribution: no fused head
        self.asft_alpha = ft.asft_alpha if ft.use_asft_loss else None
        self.accuracy = ft.compute_accuracy
        self.eval_outputs = "logits" if self.accuracy else self.outputs

    def prepasses(self) -> list[PrePass]:
        if self.asft_alpha is None:
            return []
        # the reference's logits at the label positions: B x T x V a micro-batch, so computed just before its forward
        return [PrePass(REFERENCE_LOGITS, "logits", reference_label_logits, reference=True, per_micro_batch=True)]

    def units(self, batch: SFTBatch) -> int:
        return batch.num_label_tokens

    def loss(self, outputs: ModelOutputs, batch: SFTBatch, stats: dict) -> LossOutput:
        out = sft_loss(outputs, batch, stats["units"], self.weights, self.asft_alpha)
        if self.accuracy and outputs.logits_BTV is not None and not torch.is_grad_enabled():  # an evaluation
            out.sums["accuracy"] = correct_tokens(outputs.logits_BTV, batch.targets_BT)
        return out


def correct_tokens(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """How many label tokens are the most likely token (LLaMA-Factory's compute_accuracy, summed over tokens)."""
    counted = targets_BT != IGNORE_INDEX
    return ((logits_BTV.argmax(-1) == targets_BT) & counted).sum().float()


def reference_label_logits(outputs: ModelOutputs, batch: SFTBatch) -> torch.Tensor:
    """The reference's logits at the label positions (N x V, as the forward gave them), for ASFT's KL."""
    return outputs.logits_BTV[batch.targets_BT != IGNORE_INDEX]


def token_weights(finetune):
    """The token-loss weighting the config asks for, as weights(logits_BTV, nll_BT), or None (plain NLL); ASFT's
    token loss is DFT's."""
    if finetune.use_dft_loss or finetune.use_asft_loss:
        return lambda logits_BTV, nll_BT: dft_weights(nll_BT)
    if finetune.use_eaft_loss:
        return lambda logits_BTV, nll_BT: eaft_weights(logits_BTV, finetune.eaft_alpha)
    return None
