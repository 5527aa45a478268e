"""Online RL policy update (grpo and its presets): the loss of one micro-batch of rollouts.

Log-probs come in fp32 from temperature-scaled logits, the same distribution the
responses were sampled from. Token losses are aggregated over the whole optimiser
step: `units` counts valid tokens (token-mean) or sequences (seq-mean-*), and the
Runner sums it over every micro-batch before any of them runs. The rollout engine's
own log-probs (`sampler_logps_BT`) are compared with the trainer's old ones, and
`rollout_correction` may reweight the loss by them (rollout_correction.py). The
presets of the named algorithms (dapo, gspo, ...) live in stages.py and are applied
by config.resolve(), so `cfg.rl` here is exactly what runs.
"""

from __future__ import annotations

import torch

from ..data.collate import collate_rows
from ..models.forward import ModelOutputs
from .base import LossOutput, PrePass
from .losses import IGNORE_INDEX, token_logps
from .policy_losses import POLICY_LOSSES, aggregate, kl_penalty
from .preference import LIVE_REFERENCES
from .rollout_correction import correction_weights, logp_gap


def response_logps(logits_BTV: torch.Tensor, batch, temperature: float) -> torch.Tensor:
    """Token log-probs [B, T] of the targets under temperature-scaled logits."""
    if temperature and temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    return token_logps(logits_BTV, batch.targets_BT)


class GRPOMethod:
    collate = staticmethod(collate_rows)
    outputs = "logits"
    reference_columns = None

    def __init__(self, cfg):
        self.stage = cfg.finetune.stage
        self.cfg = cfg.rl
        self.reference = cfg.finetune.pref_reference  # resolved: none unless kl_coef > 0
        self.policy_loss = POLICY_LOSSES[cfg.rl.policy_loss]
        self.per_token = cfg.rl.loss_agg_mode == "token-mean"
        self.on_policy = cfg.rl.ppo_epochs == 1 and cfg.rl.num_mini_batches == 1

    def units(self, batch) -> int:
        return int((batch.targets_BT != IGNORE_INDEX).sum()) if self.per_token else batch.num_samples

    def token_logps(self, outputs: ModelOutputs, batch) -> torch.Tensor:
        return response_logps(outputs.logits_BTV, batch, self.cfg.temperature)

    def prepasses(self) -> list[PrePass]:
        """Old log-probs once per rollout batch (strictly on-policy: the detached current ones, no extra
        forward); reference log-probs for the KL term."""
        passes = [] if self.on_policy else [PrePass("old_logps_BT", "logits", self.token_logps)]
        if self.cfg.kl_coef and self.reference in LIVE_REFERENCES:
            passes.append(PrePass("ref_logps_BT", "logits", self.token_logps, reference=True))
        return passes

    def step_sums(self, batch) -> dict[str, float]:
        return {}

    def sequence_kl(self, batch) -> torch.Tensor:
        """Per-sequence KL(policy || reference) over the response tokens (kl_in_reward), from the pre-passes."""
        mask = batch.targets_BT != IGNORE_INDEX
        policy = batch.extra["old_logps_BT"] if "old_logps_BT" in batch.extra else batch.extra["policy_logps_BT"]
        kl = kl_penalty(policy, batch.extra["ref_logps_BT"].to(policy.device), self.cfg.kl_estimator) * mask
        return kl.sum(-1).float().cpu()

    def _sampler_gap(self, losses, old, sampler, mask) -> tuple[torch.Tensor, dict]:
        """The gap between the rollout engine's log-probs and the trainer's `old` ones (the policy that sampled,
        before this step's updates), logged as sums over tokens; `rollout_correction` reweights the policy
        term's token losses by it."""
        if sampler is None:
            return losses, {}
        sampler = sampler.to(old.device)
        gap = logp_gap(old, sampler, mask)
        sums = {"rollout_logp_diff_mean": gap["abs_sum"], "rollout_logp_diff_max": gap["abs_max"],
                "rollout_kl": gap["kl_sum"]}
        weights = correction_weights(self.cfg.rollout_correction, old, sampler, mask,
                                     tis_cap=self.cfg.rollout_tis_cap, low=self.cfg.rollout_seq_mask_low,
                                     high=self.cfg.rollout_seq_mask_high)
        if weights is not None:
            losses = losses * weights
            sums["rollout_weight_mean"] = float(weights.sum())
        return losses, sums

    def loss(self, outputs: ModelOutputs, batch, stats: dict) -> LossOutput:
        cfg = self.cfg
        logits = outputs.logits_BTV
        logps = self.token_logps(outputs, batch)
        mask = batch.targets_BT != IGNORE_INDEX
        old = batch.extra.get("old_logps_BT")
        old = logps.detach() if old is None else old.to(logps.device)
        adv = batch.extra["advantages_B"].to(logps.device)[:, None].expand_as(logps)
        losses, metrics = self.policy_loss(logps, old, adv, mask.float(), clip_ratio_low=cfg.clip_ratio_low,
                                           clip_ratio_high=cfg.clip_ratio_high, dual_clip=cfg.dual_clip)
        losses, sums = self._sampler_gap(losses, old, batch.extra.get("sampler_logps_BT"), mask)
        if cfg.kl_coef and "ref_logps_BT" in batch.extra:
            kl = kl_penalty(logps, batch.extra["ref_logps_BT"].to(logps.device), cfg.kl_estimator) * mask
            if not cfg.kl_in_reward:
                losses = losses + cfg.kl_coef * kl
            sums["kl"] = float(kl.sum())
        loss = aggregate(losses, mask.float(), cfg.loss_agg_mode, normaliser=stats["units"],
                         constant_length=cfg.max_new_tokens)
        with torch.no_grad():
            probs = torch.softmax(logits.float(), -1)
            entropy = -(probs * torch.log(probs.clamp(min=1e-12))).sum(-1)
            sums["entropy"] = float((entropy * mask).sum())
        tokens = int(mask.sum())
        sums["clip_fraction"] = float(metrics.get("clip_fraction", torch.tensor(0.0))) * tokens
        return LossOutput(loss, sums, tokens)
