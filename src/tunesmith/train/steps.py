"""What a step source gives the Runner, and the per-step work every source shares.

A step source turns data into optimiser steps: `SequenceSteps` (pt, sft, rm, dpo,
kto: micro-batches of the prepared data) and `RolloutSteps` (the grpo family:
prompts rolled out, scored, turned into micro-batches with advantages). Each step
is a list of updates (one optimiser step each: one for sequence stages, ppo_epochs
x num_mini_batches for online RL); the Runner runs them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Protocol

from .. import dist
from ..models.forward import LossFn


@dataclass
class Step:
    updates: list[list]  # each: the micro-batches of one optimiser step
    num_tokens: int  # this rank's real tokens in one pass over the step's data
    epoch_ended: bool = False
    metrics: dict = field(default_factory=dict)  # the source's own (rewards, timings, ...)
    train_tokens: int | None = None  # tokens the updates process, for train_tokens_per_s (online RL)


class StepSource(Protocol):
    steps_per_epoch: int
    eval_before_training: bool  # online RL scores the starting policy first
    progress_key: str  # the metric the progress bar shows

    def prepare(self, engine) -> None:
        """One-off work before training (e.g. precomputed reference log-probs)."""

    def next_step(self, engine) -> Step:
        ...

    @property
    def eval_samples(self) -> int:
        """How many samples (or prompts) evaluate() covers."""

    def evaluate(self, engine) -> dict:
        """eval_* metrics ({} when there is nothing to evaluate)."""

    def state_dict(self) -> dict:
        """The data position (and any state a resume needs, e.g. reward statistics)."""

    def load_state_dict(self, state: dict) -> None:
        ...


def run_prepasses(engine, method, batches: list) -> None:
    """The method's pre-passes (reference or old log-probs, ...) into batch.extra, skipping values a batch
    already has (precomputed columns, or computed once per rollout batch by the source)."""
    for prepass in method.prepasses():
        missing = [b for b in batches if prepass.key not in b.extra]
        if not missing:
            continue
        with engine.reference() if prepass.reference else contextlib.nullcontext():
            values = engine.forward(missing, LossFn(prepass.outputs, prepass.fn))
        for batch, value in zip(missing, values):
            batch.extra[prepass.key] = value


def step_stats(method, batches: list, across_ranks: bool = True) -> dict:
    """The loss's step statistics: `units` (the normaliser) and the method's step sums, summed over the
    micro-batches and (across_ranks) every data-parallel rank, before any micro-batch runs."""
    units = sum(method.units(b) for b in batches)
    sums: dict[str, float] = {}
    for batch in batches:
        for key, value in method.step_sums(batch).items():
            sums[key] = sums.get(key, 0.0) + value
    if across_ranks:
        units = dist.data_sum_int(units)
        sums = {k: dist.data_sum_float(v) for k, v in sorted(sums.items())}
    return {"units": max(units, 1), **sums}


def loss_fn(method, stats: dict, evaluation: bool = False) -> LossFn:
    """The method's loss over the step's `stats`; an evaluation's forward gives what the method reads there
    (`eval_outputs`, e.g. the logits for sft's compute_accuracy), else its training outputs."""
    outputs = getattr(method, "eval_outputs", method.outputs) if evaluation else method.outputs
    return LossFn(outputs, lambda outputs, batch: method.loss(outputs, batch, stats))
