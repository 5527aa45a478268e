"""rm: a scalar reward head trained with the Bradley-Terry loss on chosen/rejected pairs.

The reward of a sequence is the head's output at its last non-padding token,
found from the batch's segment ids, so left and right padding give the same reward.
"""

from __future__ import annotations

import torch

from ..data.collate import collate_pairs
from ..models.processing import model_inputs
from .base import LossOutput, metric_sums
from .losses import bradley_terry


def last_token_index(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real (non-padding) token, under left or right padding."""
    positions = torch.arange(segment_ids_BT.shape[1], device=segment_ids_BT.device).expand_as(segment_ids_BT)
    return torch.where(segment_ids_BT >= 0, positions, -1).max(-1).values


def sequence_rewards(model, batch) -> torch.Tensor:
    """One scalar per row: the score head at the row's last real token."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(**model_inputs(base, batch)).last_hidden_state
    last = last_token_index(batch.segment_ids_BT)
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return base.score(picked).squeeze(-1).float()


class RewardModelMethod:
    stage = "rm"
    collate = staticmethod(collate_pairs)

    def __init__(self, finetune_cfg):
        self.center = finetune_cfg.reward_center_coef

    def units(self, batch) -> int:
        return batch.extra["num_pairs"]

    def prepare(self, runner) -> None:
        pass

    def loss(self, model, batch, norm: int) -> LossOutput:
        n = batch.extra["num_pairs"]
        rewards = sequence_rewards(model, batch)
        margin = batch.extra["margin_B"].to(rewards.device)
        losses, metrics = bradley_terry(rewards[:n], rewards[n:], margin_B=margin, center_coef=self.center)
        return LossOutput(losses.sum() / norm, metric_sums(metrics), n)
