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
from ..engines.base import StepOutput
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


def run_prepasses(engine, method, batches: list, per_micro_batch: bool | None = None) -> None:
    """The method's pre-passes (reference or old log-probs, ...) into batch.extra, skipping values a batch
    already has (precomputed columns, or computed once per rollout batch by the source); `per_micro_batch`
    True or False: only those whose PrePass.per_micro_batch is that (None: all)."""
    for prepass in method.prepasses():
        if per_micro_batch is not None and prepass.per_micro_batch != per_micro_batch:
            continue
        missing = [b for b in batches if prepass.key not in b.extra]
        if not missing:
            continue
        with engine.reference() if prepass.reference else contextlib.nullcontext():
            values = engine.forward(missing, LossFn(prepass.outputs, prepass.fn))
        for batch, value in zip(missing, values):
            batch.extra[prepass.key] = value


def drop_per_micro_batch(method, batch) -> None:
    """Free the values of the per-micro-batch pre-passes once the batch's forward has read them."""
    for prepass in method.prepasses():
        if prepass.per_micro_batch:
            batch.extra.pop(prepass.key, None)


def forward_backward(engine, method, update: list) -> StepOutput:
    """One optimiser step's forward and backward passes: the step-wide pre-passes and statistics first, then
    every micro-batch, gradients accumulated (the engine steps after). A method with per-micro-batch pre-passes
    (too large to hold for the whole step) has each micro-batch's computed just before its forward; the engine
    then runs the micro-batches one call each, which accumulates the same gradients (not on backend: megatron,
    whose schedule takes the whole step: config refuses those methods there)."""
    run_prepasses(engine, method, update, per_micro_batch=False)
    fn = loss_fn(method, step_stats(method, update))
    if not any(prepass.per_micro_batch for prepass in method.prepasses()):
        return engine.forward_backward(update, fn)
    total = StepOutput()
    for batch in update:
        run_prepasses(engine, method, [batch], per_micro_batch=True)
        total.add(engine.forward_backward([batch], fn))
        drop_per_micro_batch(method, batch)
    return total


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
