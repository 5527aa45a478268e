"""kto: Kahneman-Tversky optimisation on unpaired good/bad examples.

The KL reference point z0 is estimated from mismatched pairs (each prompt with
another example's completion), as in the KTO paper, over the whole optimiser step
and every data-parallel rank: the policy's log-probs of the mismatched twins come
from a pre-pass without gradients (z0 is detached in the loss anyway), and the
Runner sums `step_sums` over the step's micro-batches and the ranks, as it does
for the normaliser.
"""

from __future__ import annotations

import torch

from ..data.collate import collate_kto
from ..models.forward import ModelOutputs
from .base import LossOutput, PrePass, metric_sums
from .losses import kto
from .preference import batch_logps, reference_or_zeros, reference_prepass, sequence_logps_fn


class KTOMethod:
    stage = "kto"
    collate = staticmethod(collate_kto)
    outputs = "logits"
    reference_columns = ("ref_logps", "ref_kl_logps")
    average = False  # summed log-probs (the precomputed reference stores these)

    def __init__(self, cfg):
        ft = cfg.finetune
        self.kwargs = {"beta": ft.pref_beta, "desirable_weight": ft.kto_chosen_weight,
                       "undesirable_weight": ft.kto_rejected_weight}
        self.reference = ft.pref_reference

    def units(self, batch) -> int:
        return batch.extra["num_examples"]

    def prepasses(self) -> list[PrePass]:
        policy_kl = PrePass("policy_logps_B", "logits", sequence_logps_fn(average=False))
        return [policy_kl, *reference_prepass(self.reference, average=False)]

    def step_sums(self, batch) -> dict[str, float]:
        """Sum and count of (policy - reference) over the mismatched twins: z0 = max(sum / count, 0)."""
        n = batch.extra["num_examples"]
        policy = batch.extra["policy_logps_B"].float()
        ref = reference_or_zeros(batch, policy).float()
        return {"kl_sum": float((policy[n:] - ref[n:]).sum()), "kl_count": n}

    def loss(self, outputs: ModelOutputs, batch, stats: dict) -> LossOutput:
        n = batch.extra["num_examples"]
        total, _, _ = batch_logps(outputs.logits_BTV, batch)
        ref = reference_or_zeros(batch, total)
        kl = torch.tensor(max(stats["kl_sum"] / max(stats["kl_count"], 1), 0.0), dtype=torch.float32)
        desirable = batch.extra["desirable_B"].to(total.device)
        losses, metrics = kto(total[:n], ref[:n], desirable, kl, **self.kwargs)
        # LLaMA-Factory's and TRL's KTO logits/chosen: each example's logits summed over its row and the vocabulary
        logits = outputs.logits_BTV[:n].detach().sum(dim=(1, 2), dtype=torch.float32)
        chosen = desirable.float()
        metrics.update({"logits/chosen": logits * chosen, "logits/rejected": logits * (1 - chosen)})
        return LossOutput(losses.sum() / stats["units"], metric_sums(metrics), n)
