"""kto: Kahneman-Tversky optimisation on unpaired good/bad examples.

The KL reference point is estimated per micro-batch from mismatched pairs (each
prompt with another example's completion), as in the KTO paper.
"""

from __future__ import annotations

from ..data.collate import collate_kto
from .base import LossOutput, metric_sums
from .losses import kto, kto_kl_estimate
from .preference import Reference, batch_logps, precompute_reference


class KTOMethod:
    stage = "kto"
    collate = staticmethod(collate_kto)

    def __init__(self, cfg, model):
        ft = cfg.finetune
        self.kwargs = {"beta": ft.pref_beta, "desirable_weight": ft.kto_chosen_weight,
                       "undesirable_weight": ft.kto_rejected_weight}
        self.reference = Reference(cfg, model, needed=True)

    def units(self, batch) -> int:
        return batch.extra["num_examples"]

    def prepare(self, runner) -> None:
        if self.reference.mode == "precomputed":
            precompute_reference(runner, ("ref_logps", "ref_kl_logps"), average=False)

    def loss(self, model, batch, norm: int) -> LossOutput:
        n = batch.extra["num_examples"]
        total, _, _ = batch_logps(model, batch)
        ref = self.reference.logps(model, batch, average=False)
        if ref is None:
            ref = total.detach() * 0
        kl = kto_kl_estimate(total[n:], ref[n:])
        desirable = batch.extra["desirable_B"].to(total.device)
        losses, metrics = kto(total[:n], ref[:n], desirable, kl, **self.kwargs)
        return LossOutput(losses.sum() / norm, metric_sums(metrics), n)
