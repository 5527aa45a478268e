"""dpo: preference optimisation (pref_loss sigmoid / hinge / ipo / robust / orpo / simpo), optional SFT term.

Chosen and rejected go through one forward; losses are per pair, divided by the
number of pairs of the whole optimiser step.
"""

from __future__ import annotations

from ..data.collate import collate_pairs
from ..models.forward import ModelOutputs
from .base import LossOutput, PrePass, metric_sums
from .losses import LOSSES
from .preference import batch_logps, reference_or_zeros, reference_prepass, response_logit_means

PREF_LOSSES = {"sigmoid": "dpo_sigmoid", "hinge": "dpo_hinge", "ipo": "dpo_ipo", "robust": "dpo_robust",
               "orpo": "orpo", "simpo": "simpo"}


class DPOMethod:
    stage = "dpo"
    collate = staticmethod(collate_pairs)
    outputs = "logits"
    reference_columns = ("ref_chosen_logps", "ref_rejected_logps")

    def __init__(self, cfg):
        ft = cfg.finetune
        self.loss_fn = LOSSES[PREF_LOSSES[ft.pref_loss]]
        self.kwargs = {"beta": ft.pref_beta, "label_smoothing": ft.pref_label_smoothing, "simpo_gamma": ft.simpo_gamma}
        self.ftx = ft.pref_ftx
        self.reference = ft.pref_reference  # resolved: none for orpo / simpo
        self.average = self.loss_fn.uses_average

    def units(self, batch) -> int:
        return batch.extra["num_pairs"]

    def prepasses(self) -> list[PrePass]:
        return reference_prepass(self.reference, self.average)

    def step_sums(self, batch) -> dict[str, float]:
        return {}

    def loss(self, outputs: ModelOutputs, batch, stats: dict) -> LossOutput:
        n = batch.extra["num_pairs"]
        total, mean, counts = batch_logps(outputs.logits_BTV, batch)
        policy = mean if self.average else total
        ref = reference_or_zeros(batch, policy)
        losses, metrics = self.loss_fn(policy[:n], policy[n:], ref[:n], ref[n:], **self.kwargs)
        logits = response_logit_means(outputs.logits_BTV, batch.targets_BT)
        metrics.update({"logps/chosen": policy[:n].detach(), "logps/rejected": policy[n:].detach(),
                        "logits/chosen": logits[:n], "logits/rejected": logits[n:]})
        if self.ftx:
            sft = -total[:n] / counts[:n].clamp(min=1)
            losses = losses + self.ftx * sft
            metrics["sft_loss"] = sft.detach()
        return LossOutput(losses.sum() / stats["units"], metric_sums(metrics), n)
