"""rm: a scalar reward head trained with the Bradley-Terry loss on chosen/rejected pairs.

The engine's "rewards" forward gives the head's output at each row's last real
token (models/forward.py), so left and right padding give the same reward.
"""

from __future__ import annotations

from ..data.collate import collate_pairs
from ..models.forward import ModelOutputs
from .base import LossOutput, NoPrePasses, metric_sums
from .losses import bradley_terry


class RewardModelMethod(NoPrePasses):
    stage = "rm"
    collate = staticmethod(collate_pairs)
    outputs = "rewards"

    def __init__(self, cfg):
        self.center = cfg.finetune.reward_center_coef

    def units(self, batch) -> int:
        return batch.extra["num_pairs"]

    def loss(self, outputs: ModelOutputs, batch, stats: dict) -> LossOutput:
        n = batch.extra["num_pairs"]
        rewards = outputs.rewards_B
        margin = batch.extra["margin_B"].to(rewards.device)
        losses, metrics = bradley_terry(rewards[:n], rewards[n:], margin_B=margin, center_coef=self.center)
        return LossOutput(losses.sum() / stats["units"], metric_sums(metrics), n)
