"""dpo: preference optimisation (pref_loss sigmoid / hinge / ipo / robust / orpo / simpo), optional SFT term.

Chosen and rejected go through one forward; losses are per pair, divided by the
number of pairs of the whole optimiser step.
"""

from __future__ import annotations

from ..data.collate import collate_pairs
from .base import LossOutput, metric_sums
from .losses import LOSSES
from .preference import Reference, batch_logps, precompute_reference

PREF_LOSSES = {"sigmoid": "dpo_sigmoid", "hinge": "dpo_hinge", "ipo": "dpo_ipo", "robust": "dpo_robust",
               "orpo": "orpo", "simpo": "simpo"}


class DPOMethod:
    stage = "dpo"
    collate = staticmethod(collate_pairs)

    def __init__(self, cfg, model):
        ft = cfg.finetune
        self.loss_fn = LOSSES[PREF_LOSSES[ft.pref_loss]]
        self.kwargs = {"beta": ft.pref_beta, "label_smoothing": ft.pref_label_smoothing, "simpo_gamma": ft.simpo_gamma}
        self.ftx = ft.pref_ftx
        self.reference = Reference(cfg, model, needed=self.loss_fn.needs_reference)

    def units(self, batch) -> int:
        return batch.extra["num_pairs"]

    def prepare(self, runner) -> None:
        if self.reference.mode == "precomputed":
            precompute_reference(runner, ("ref_chosen_logps", "ref_rejected_logps"), self.loss_fn.uses_average)

    def loss(self, model, batch, norm: int) -> LossOutput:
        n = batch.extra["num_pairs"]
        total, mean, counts = batch_logps(model, batch)
        policy = mean if self.loss_fn.uses_average else total
        ref = self.reference.logps(model, batch, self.loss_fn.uses_average)
        ref_c, ref_r = (ref[:n], ref[n:]) if ref is not None else (policy.new_zeros(n), policy.new_zeros(n))
        losses, metrics = self.loss_fn(policy[:n], policy[n:], ref_c, ref_r, **self.kwargs)
        if self.ftx:
            sft = -total[:n] / counts[:n].clamp(min=1)
            losses = losses + self.ftx * sft
            metrics["sft_loss"] = sft.detach()
        return LossOutput(losses.sum() / norm, metric_sums(metrics), n)
