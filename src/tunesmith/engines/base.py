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
import logging
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Protocol

import torch

from ..errors import TunesmithError
from ..models.forward import LossFn  # noqa: F401  (part of the interface)

log = logging.getLogger("tunesmith")


class NonFiniteError(TunesmithError):
    """A non-finite loss or gradient; the Runner names the step."""


class CheckpointError(TunesmithError):
    """A checkpoint that cannot be saved, is incomplete or corrupt, or is not trusted. Names the file and the fix."""


@dataclass
class StepResult:
    """grad_norm and skipped are floats/bools, or 0-dim device tensors that the Runner reads once the GPU has
    finished them (train/step_values.py), so that step() need not wait for the GPU."""

    grad_norm: float
    skipped: bool  # non-finite loss or gradient: the update was not applied
    lr: float
    may_skip: bool = True  # False (skip_nonfinite: false): a skipped step is an error, raised when it is read
    on_skip: Callable[[], None] | None = None  # the engine's own follow-up when the skip is read (see local_step)


def combine_sum(key: str, total, value):
    """A method's metric sums add up over micro-batches, steps and ranks, except those named `*_max`, whose
    largest value is kept (and not divided by the units at logging)."""
    if total is None:
        return value
    if key.endswith("_max"):
        return torch.maximum(torch.as_tensor(total), torch.as_tensor(value)) if torch.is_tensor(value) or \
            torch.is_tensor(total) else max(total, value)
    return total + value


def metric_means(sums: dict, count: int) -> dict:
    """A method's metric sums as the means that are logged: each divided by the units it covers (`count`), except
    `*_max` (kept), `nll` (the token loss, logged as loss) and the per-class counts `count/<class>`, which divide the
    metrics of that class instead (KTO's rewards/chosen is a mean over the desirable examples, as TRL and
    LLaMA-Factory log it; a class absent from the window logs nothing). Per-class rewards give rewards/margins,
    chosen − rejected."""
    means = {}
    for key, value in sums.items():
        if key == "nll" or key.startswith("count/"):
            continue
        per_class = sums.get("count/" + key.rpartition("/")[2]) if "/" in key else None
        if key.endswith("_max"):
            means[key] = value
        elif per_class is None:
            means[key] = value / max(count, 1)
        elif per_class > 0:
            means[key] = value / per_class
    if "count/chosen" in sums and {"rewards/chosen", "rewards/rejected"} <= means.keys():
        means["rewards/margins"] = means["rewards/chosen"] - means["rewards/rejected"]
    return means


@dataclass
class StepOutput:
    """This rank's sums over the micro-batches of one forward_backward call.

    add() keeps device tensors as they are (reading one would make the host wait for the GPU in the middle of
    the step); the Runner reads them once the GPU has finished them (train/step_values.py). An engine that
    must have host values (a collective over pipeline stages) calls settle()."""

    loss: float = 0.0
    sums: dict = field(default_factory=dict)
    count: int = 0

    def add(self, out) -> None:
        """Add a micro-batch's LossOutput, or another StepOutput (settled or not)."""
        self.loss = self.loss + (out.loss.detach() if torch.is_tensor(out.loss) else out.loss)
        self.count += out.count
        for key, value in out.sums.items():
            value = value.detach() if torch.is_tensor(value) else value
            self.sums[key] = combine_sum(key, self.sums.get(key), value)

    def settle(self) -> "StepOutput":
        self.loss = float(self.loss)
        self.sums = {key: float(value) for key, value in self.sums.items()}
        return self


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

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """Restore a checkpoint written by export_hf + save: weights, optimizer, scheduler. `trusted`: the
        checkpoint verified against this installation's key (train/checkpoint.py) or the user set
        trust_checkpoint; without it an engine reads no pickled state (DCP metadata, DeepSpeed's files)."""

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        """Resume a Hugging Face Trainer checkpoint: its safetensors weights, the LR schedule moved on to `step`,
        the optimizer from `optimizer_state` (read weights_only) where it fits, else fresh."""

    def export_hf(self, path: Path, saver) -> None:
        """A Hugging Face directory (or PEFT adapter) loadable without tunesmith."""

    def full_state_for_rollout(self) -> dict:
        """Full (unsharded) weights for a rollout engine with its own copy of the model."""


def nonfinite(flag, out):
    """`flag` (False or a device bool tensor) or'ed with "this micro-batch's loss is not finite", without
    reading it on the host: engines read the flag once, in step()."""
    return flag | ~torch.isfinite(out.loss.detach())


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


def write_torch_file(obj, path: Path) -> None:
    """torch.save through a Python file: a full disk is an OSError(ENOSPC) here (torch's own file writer reports
    it as "unexpected pos ..." or not at all)."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def read_torch_file(path: Path, *, map_location="cpu", allow: list | tuple = ()):
    """torch.load with weights_only=True: tensors, numbers, strings and containers (plus the classes in `allow`)
    only, so a checkpoint can never run code through it. Errors name the file and the fix."""
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete; resume from another checkpoint "
                              "(resume_from_checkpoint: <path>)") from None
    except pickle.UnpicklingError as err:
        found = re.search(r"(unsupported[^\n]*?GLOBAL [\w.]+|Unsupported[^\n]*)", str(err), re.IGNORECASE)
        raise CheckpointError(
            f"{path} holds pickled objects other than tensors and plain values "
            f"({found.group(0) if found else type(err).__name__}): refused, nothing in it was run. It was not "
            "written by tunesmith; resume from another checkpoint") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as err:
        raise CheckpointError(f"{path} is corrupt or truncated ({type(err).__name__}: {str(err)[:200]}); resume "
                              "from another checkpoint (resume_from_checkpoint: <path>)") from None


def schedule_at(optimizer, scheduler, step: int) -> None:
    """Move a freshly built LR schedule on to `step` (a checkpoint that holds no schedule of ours)."""
    from .optim import realign_schedule

    if getattr(scheduler, "lr_lambdas", None) is None:  # not a LambdaLR: replay it
        for _ in range(step):
            scheduler.step()
        return
    scheduler.last_epoch = step
    realign_schedule(optimizer, scheduler)


@contextlib.contextmanager
def keeping_settings(optimizer):
    """Load a checkpoint's optimizer state inside this: this run's group settings (betas, weight decay, GaLore's /
    APOLLO's) stay, so a change resume_allow_changes accepted applies (the learning rate follows the schedule),
    and the optimizer's settle_settings, where it has one, passes them on."""
    kept = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    yield
    for group, settings in zip(optimizer.param_groups, kept):
        group.update(settings)
    settle = getattr(optimizer, "settle_settings", None)
    if settle is not None:
        settle()


def load_own_optimizer(optimizer, state: dict, path: Path) -> None:
    """A tunesmith checkpoint's optimizer state (moments, step counts, projectors) under this run's settings
    (keeping_settings). One written by another optimizer is refused by name, not with torch's error."""
    with keeping_settings(optimizer):
        try:
            optimizer.load_state_dict(state)
        except (KeyError, ValueError, IndexError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{path}: its optimizer state does not fit this run's optimizer "
                                  f"({type(err).__name__}: {str(err)[:120]}); resume with the optimizer settings it "
                                  "was saved with (use_muon, use_adam_mini, use_galore, use_apollo, "
                                  "use_badam, loraplus_lr_ratio)") from None


def from_bitsandbytes(optimizer) -> bool:
    """Whether the optimizer is one of bitsandbytes' (its state: state1/state2, copied onto the device it loads)."""
    return type(optimizer).__module__.startswith("bitsandbytes")


def load_matching_optimizer(optimizer, state: dict, path: Path) -> bool:
    """Load another trainer's optimizer state (moments, step counts) if its groups hold parameters of our shapes
    in our order; our hyperparameters (lr, betas, weight decay) stay. Otherwise warn and start fresh."""
    saved_groups = state.get("param_groups") if isinstance(state, dict) else None
    ours = [g["params"] for g in optimizer.param_groups]
    fits = isinstance(saved_groups, list) and [len(g.get("params", [])) for g in saved_groups] == [len(p) for p in ours]
    moment = "state1" if from_bitsandbytes(optimizer) else "exp_avg"
    if fits:
        moments = state.get("state", {})
        for group, saved in zip(ours, saved_groups):
            for param, index in zip(group, saved["params"]):
                entry = moments.get(index, {})
                held = entry.get("__bnb_optimizer_quant_state__", entry).get(moment)  # bitsandbytes wraps its own
                # another optimizer's moments (torch's exp_avg against bitsandbytes' state1, or the reverse)
                fits = fits and (held is not None or not entry) and (held is None or tuple(held.shape) ==
                                                                     tuple(param.shape))
    if fits:
        try:
            with keeping_settings(optimizer):
                optimizer.load_state_dict(state)
            return True
        except (KeyError, ValueError, TypeError) as err:  # another optimizer's state (BAdam's needs its own)
            log.debug("%s: %s", path, err)
    log.warning("%s does not fit this model's optimizer (other parameter groups or shapes): the optimizer "
                "starts fresh", path)
    return False
