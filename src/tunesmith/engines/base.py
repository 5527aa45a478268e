"""The Engine interface: a model, a Batch and a loss function, nothing else.

The loss is passed in (rather than called by the loop) because pipeline-parallel
engines must run it inside their micro-batch schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol


@dataclass
class StepResult:
    grad_norm: float
    skipped: bool  # non-finite gradient with skip_nonfinite: true
    lr: float


class Engine(Protocol):
    model: object

    def forward_backward(self, batch, loss_fn: Callable) -> object:
        """Run loss_fn(model, batch) and its backward pass; returns the loss output."""

    def step(self) -> StepResult:
        """Clip, check, optimiser and scheduler step, zero the gradients."""

    def save(self, path: Path) -> None:
        """Resumable engine state (optimizer, scheduler) into path."""

    def load(self, path: Path) -> None:
        """Restore what save() wrote."""

    def export_hf(self, path: Path, tokenizer) -> None:
        """A Hugging Face directory (or PEFT adapter) loadable without tunesmith."""

    def full_state_for_rollout(self) -> dict:
        """Full (unsharded) weights for a rollout engine."""
