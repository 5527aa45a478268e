"""What the Runner needs from a training method (a stage), and the loss output every method returns.

A method never sees the backend and never calls the model: it names the outputs
it needs (`outputs`: logits, nll or rewards), and its `loss(outputs, batch, stats)`
is a pure function of the engine's outputs and the batch. `stats` holds the
statistics of the whole optimiser step, summed over every micro-batch and every
data-parallel rank by the Runner before any micro-batch runs: `units` (the
normaliser: label tokens for pt/sft, pairs for rm/dpo, examples for kto) and
whatever `step_sums` adds (e.g. KTO's KL reference point). Values a loss needs
from another forward pass without gradients (reference log-probs, old log-probs)
are declared as `prepasses`; the Runner has the engine compute them into
`batch.extra[key]` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from ..models.forward import ModelOutputs, OutputKind


@dataclass
class LossOutput:
    loss: torch.Tensor  # this micro-batch's share of the step loss
    sums: dict = field(default_factory=dict)  # metric sums over this micro-batch's units, for logging
    count: int = 0  # the units those sums cover


@dataclass(frozen=True)
class PrePass:
    """batch.extra[key] = fn(outputs, batch), computed without gradients, on the reference policy if `reference`.

    `per_micro_batch`: computed just before its micro-batch's forward and dropped after it, instead of for the
    whole step first (values too large to hold for every micro-batch at once: ASFT's reference logits)."""

    key: str
    outputs: OutputKind
    fn: Callable[[ModelOutputs, object], torch.Tensor]
    reference: bool = False
    per_micro_batch: bool = False


class Method(Protocol):
    stage: str
    collate: Callable  # data.collate function that turns rows into this method's Batch
    outputs: OutputKind
    # Data columns that hold precomputed reference log-probs (pref_reference: precomputed), or None.
    reference_columns: tuple[str, str] | None

    def units(self, batch) -> int:
        """This micro-batch's contribution to the step normaliser."""

    def prepasses(self) -> list[PrePass]:
        """Values the loss reads from batch.extra, computed before the step."""

    def step_sums(self, batch) -> dict[str, float]:
        """Statistics of this micro-batch (after its prepasses) that the loss needs summed over the whole step."""

    def loss(self, outputs: ModelOutputs, batch, stats: dict) -> LossOutput:
        """The micro-batch loss divided by stats["units"]."""


def metric_sums(metrics: dict) -> dict:
    """Per-example metric tensors -> plain float sums."""
    return {name: float(value.detach().float().sum()) for name, value in metrics.items()}


class NoPrePasses:
    """Default parts of a Method that needs no extra forward pass and no step statistics."""

    reference_columns = None

    def prepasses(self) -> list[PrePass]:
        return []

    def step_sums(self, batch) -> dict[str, float]:
        return {}
