"""What the loop needs from a training method (a stage), and the loss output every method returns.

A method never sees the backend: it gets the model and a Batch and returns a loss
already divided by the normaliser the loop computed for the whole optimiser step
(`units` summed over all micro-batches: label tokens for pt/sft, pairs for rm/dpo,
examples for kto).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch


@dataclass
class LossOutput:
    loss: torch.Tensor  # this micro-batch's share of the step loss
    sums: dict = field(default_factory=dict)  # metric sums over this micro-batch's units, for logging
    count: int = 0  # the units those sums cover


class Method(Protocol):
    stage: str
    collate: Callable  # data.collate function that turns rows into this method's Batch

    def units(self, batch) -> int:
        """This micro-batch's contribution to the step normaliser."""

    def loss(self, model, batch, norm: int) -> LossOutput:
        """The micro-batch loss divided by `norm`."""

    def prepare(self, runner) -> None:
        """One-off work before training (e.g. precomputed reference log-probs)."""


def metric_sums(metrics: dict) -> dict:
    """Per-example metric tensors -> plain float sums."""
    return {name: float(value.detach().float().sum()) for name, value in metrics.items()}
