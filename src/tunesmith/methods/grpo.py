"""Online RL policy update (grpo and its presets): the loss of one micro-batch of rollouts.

Log-probs come in fp32 from temperature-scaled logits, the same distribution the
responses were sampled from. Token losses are aggregated over the whole optimiser
step: `units` counts valid tokens (token-mean) or sequences (seq-mean-*), and the
loop sums it over every micro-batch before any of them runs.
"""

from __future__ import annotations

import torch

from ..data.collate import collate_rows
from .base import LossOutput
from .losses import IGNORE_INDEX, token_logps
from .policy_losses import POLICY_LOSSES, aggregate, kl_penalty
from .sft import forward_logits

# Stage presets: the settings each named algorithm implies, unless the YAML sets them.
PRESETS = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg_mode": "seq-mean-token-sum-norm"},
    "dapo": {"clip_ratio_high": 0.28, "dynamic_sampling": True, "loss_agg_mode": "token-mean"},
    "gspo": {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4,
             "loss_agg_mode": "seq-mean-token-mean"},
    "gspo_token": {"policy_loss": "gspo_token", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4,
                   "loss_agg_mode": "seq-mean-token-mean"},
    "reinforce": {"advantage": "reinforce", "policy_loss": "reinforce", "loss_agg_mode": "token-mean",
                  "ppo_epochs": 1, "num_mini_batches": 1, "kl_coef": 0.0},
}
RL_STAGES = tuple(PRESETS)


def response_logps(model, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token log-probs [B, T] of the targets under temperature-scaled logits, the response mask, the logits."""
    logits = forward_logits(model, batch)
    if temperature and temperature != 1.0:
        logits = logits / temperature
    return token_logps(logits, batch.targets_BT), batch.targets_BT != IGNORE_INDEX, logits


class GRPOMethod:
    collate = staticmethod(collate_rows)

    def __init__(self, rl_cfg, stage: str):
        self.stage = stage
        self.cfg = rl_cfg
        self.policy_loss = POLICY_LOSSES[rl_cfg.policy_loss]
        self.per_token = rl_cfg.loss_agg_mode == "token-mean"

    def units(self, batch) -> int:
        return int((batch.targets_BT != IGNORE_INDEX).sum()) if self.per_token else batch.num_samples

    def prepare(self, runner) -> None:
        pass

    def loss(self, model, batch, norm: int) -> LossOutput:
        cfg = self.cfg
        logps, mask, logits = response_logps(model, batch, cfg.temperature)
        old = batch.extra.get("old_logps_BT")
        old = logps.detach() if old is None else old.to(logps.device)
        adv = batch.extra["advantages_B"].to(logps.device)[:, None].expand_as(logps)
        losses, metrics = self.policy_loss(logps, old, adv, mask.float(), clip_ratio_low=cfg.clip_ratio_low,
                                           clip_ratio_high=cfg.clip_ratio_high, dual_clip=cfg.dual_clip)
        sums = {}
        if cfg.kl_coef and "ref_logps_BT" in batch.extra:
            kl = kl_penalty(logps, batch.extra["ref_logps_BT"].to(logps.device), cfg.kl_estimator) * mask
            if not cfg.kl_in_reward:
                losses = losses + cfg.kl_coef * kl
            sums["kl"] = float(kl.sum())
        loss = aggregate(losses, mask.float(), cfg.loss_agg_mode, normaliser=norm, constant_length=cfg.max_new_tokens)
        with torch.no_grad():
            probs = torch.softmax(logits.float(), -1)
            entropy = -(probs * torch.log(probs.clamp(min=1e-12))).sum(-1)
            sums["entropy"] = float((entropy * mask).sum())
        tokens = int(mask.sum())
        sums["clip_fraction"] = float(metrics.get("clip_fraction", torch.tensor(0.0))) * tokens
        return LossOutput(loss, sums, tokens)
