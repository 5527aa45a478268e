"""The Engine interface: the only way the Runner and the step sources touch the model.

An engine owns the forward pass: the Runner hands it micro-batches and a LossFn
(which outputs to compute, and a pure function of those outputs and the batch),
and it runs the model however its backend must — autocast on one device, sharded
under FSDP2 or DeepSpeed, or (Megatron pipeline parallelism) inside its own
micro-batch schedule. That is why the loss is passed in rather than called by
the Runner. Engines are siblings: each implements this protocol in full.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Protocol

import torch

from ..errors import TunesmithError
from ..models.forward import LossFn  # noqa: F401  (part of the interface)


class NonFiniteError(TunesmithError):
    """A non-finite loss or gradient; the Runner names the step."""


@dataclass
class StepResult:
    grad_norm: float
    skipped: bool  # non-finite gradient with skip_nonfinite: true
    lr: float


@dataclass
class StepOutput:
    """This rank's sums over the micro-batches of one forward_backward call."""

    loss: float = 0.0
    sums: dict = field(default_factory=dict)
    count: int = 0

    def add(self, out) -> None:
        self.loss += float(out.loss.detach())
        self.count += out.count
        for key, value in out.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value


class Engine(Protocol):
    device: torch.device
    model: torch.nn.Module  # the live policy (generation in the rollout shares it)

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        """Forward and backward of every micro-batch, gradients accumulated until step()."""

    def forward(self, micro_batches: list, fn: LossFn) -> list:
        """fn of each micro-batch's outputs without gradients, in eval mode (evaluation, log-probs)."""

    def reference(self) -> ContextManager:
        """Inside it, forward() runs the reference policy (LoRA adapters off, or the frozen copy)."""

    def step(self) -> StepResult:
        """Clip, check, optimiser and scheduler step, zero the gradients."""

    def save(self, path: Path) -> None:
        """Resumable engine state (optimizer, scheduler; weights where export_hf does not hold them)."""

    def load(self, path: Path) -> None:
        """Restore a checkpoint written by export_hf + save: weights, optimizer, scheduler."""

    def export_hf(self, path: Path, saver) -> None:
        """A Hugging Face directory (or PEFT adapter) loadable without tunesmith."""

    def full_state_for_rollout(self) -> dict:
        """Full (unsharded) weights for a rollout engine with its own copy of the model."""


def check_finite(out) -> bool:
    return bool(torch.isfinite(out.loss.detach()))


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module):
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@contextlib.contextmanager
def switched_to_reference(engine):
    """engine.reference(): forward() runs the reference policy until the block ends."""
    engine._on_reference = True
    try:
        yield engine
    finally:
        engine._on_reference = False


def forward_module(engine, policy: torch.nn.Module):
    """The module forward() runs: the policy, or (inside engine.reference()) the reference view's."""
    return engine.ref.module(policy) if engine._on_reference else contextlib.nullcontext(policy)
