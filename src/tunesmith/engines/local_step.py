"""The optimiser step shared by the engines that run torch's optimizer themselves (single, fsdp2)."""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as tdist

from ..models.forward import run_forward
from .base import LossFn, NonFiniteError, StepOutput, StepResult, eval_mode, forward_module, nonfinite
from .optim import take_back_schedule_step


def _local_norm(params: list) -> torch.Tensor:
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])


def clip_and_step(model, optimizer, scheduler, scaler, *, max_grad_norm: float, skip_nonfinite: bool,
                  nonfinite_loss, total_norm=_local_norm) -> StepResult:
    """Unscale (fp16), clip, refuse or skip a non-finite step, update, schedule, zero the gradients.
    `total_norm(params)`: the gradients' norm (an engine whose parameters are shards gives the whole model's).
    `nonfinite_loss`: False, or a device bool tensor (a micro-batch's loss was not finite).

    A fused AdamW on plain tensors takes the whole decision on the device: it divides by the clipping factor
    (its `grad_scale`, the hook AMP uses) and skips the update when `found_inf` is set, so the step never waits
    for the GPU, and the result holds device tensors that the Runner reads once the GPU is done with them."""
    if getattr(optimizer, "steps_in_backward", False):
        return _stepped_in_backward(optimizer, scheduler, nonfinite_loss)
    params = [p for p in model.parameters() if p.requires_grad]
    if scaler:
        scaler.unscale_(optimizer)
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    grads = [p.grad for p in params if p.grad is not None]
    # an engine's own norm is a collective: every rank takes part, one without gradients (a frozen stage) too
    total = total_norm(params) if grads or total_norm is not _local_norm else None
    if scaler is None and optimizer.defaults.get("fused") and type(total) is torch.Tensor:  # not FSDP2's DTensors
        return _step_on_device(optimizer, scheduler, total, nonfinite_loss, max_norm, skip_nonfinite)
    grad_norm = _clip(grads, total, max_norm)
    lr = scheduler.get_last_lr()[0]
    if (bool(nonfinite_loss) or not math.isfinite(grad_norm)) and scaler is None:
        optimizer.zero_grad(set_to_none=True)
        if not skip_nonfinite:
            raise NonFiniteError(f"non-finite loss or gradient (grad norm {grad_norm})")
        return StepResult(grad_norm, True, lr)
    if scaler:
        scaler.step(optimizer)  # skips the update itself on inf/nan
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(grad_norm, False, lr)


def _stepped_in_backward(optimizer, scheduler, nonfinite_loss) -> StepResult:
    """Per-layer GaLore / APOLLO (engines/low_rank.PerParameterSteps) updated every parameter in the backward pass:
    nothing is left to clip or skip. The gradient norm is the one its hooks summed; a non-finite loss or norm stops
    the run (the update has happened: config refuses skip_nonfinite with it)."""
    lr = scheduler.get_last_lr()[0]
    norm = optimizer.finish_step()
    if bool(nonfinite_loss) or not math.isfinite(float(norm)):
        raise NonFiniteError(f"non-finite loss or gradient (grad norm {float(norm)}) in a per-layer update")
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(norm, False, lr)


def _step_on_device(optimizer, scheduler, total: torch.Tensor, nonfinite_loss, max_norm: float,
                    skip_nonfinite: bool) -> StepResult:
    """clip_grad_norm_'s factor max_norm / (norm + 1e-6), at most 1, as the fused update's divisor; a non-finite
    norm or loss sets found_inf, and the update leaves parameters, moments and step counts as they were."""
    lr = scheduler.get_last_lr()[0]
    norm = total.detach().float()
    found_inf = (~torch.isfinite(norm) | nonfinite_loss).float()
    if tdist.is_initialized() and tdist.get_world_size() > 1:  # one rank's non-finite loss skips the step everywhere
        tdist.all_reduce(found_inf, op=tdist.ReduceOp.MAX)  # queued on the device, nothing read on the host
    optimizer.found_inf = found_inf
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0) if math.isfinite(max_norm) else None
    try:
        optimizer.step()
    finally:
        optimizer.grad_scale = optimizer.found_inf = None
    scheduler.step()  # on a skipped update, taken back when the Runner reads the result (on_skip)
    optimizer.zero_grad(set_to_none=True)
    return StepResult(norm, found_inf.bool(), lr, may_skip=skip_nonfinite,
                      on_skip=functools.partial(take_back_schedule_step, optimizer, scheduler))


def _clip(grads: list, total, max_norm: float) -> float:
    """The gradients' total norm read on the host, and the gradients scaled to at most max_norm, as
    clip_grad_norm_ does (nothing is scaled when the norm is within the bound)."""
    if not grads:
        return 0.0
    grad_norm = float(total)
    if math.isfinite(grad_norm) and grad_norm > max_norm:
        torch._foreach_mul_(grads, max_norm / (grad_norm + 1e-6))
    return grad_norm


def autocast(precision: str, device: torch.device):
    """bf16 / fp16 mixed precision on one device; a no-op for fp32 and pure_bf16."""
    import contextlib

    if precision in ("bf16", "fp16"):
        return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


def backward_each(engine, micro_batches: list, loss_fn: LossFn, loss_scale: int = 1) -> StepOutput:
    """Forward and backward of each micro-batch on engine.model (gradients accumulate). `loss_scale`: sharded
    engines average gradients over ranks, and the Runner's normaliser wants their sum."""
    engine.model.train()
    total = StepOutput()
    for batch in micro_batches:
        batch = batch.to(engine.device)
        with autocast(engine.precision, engine.device):
            out = loss_fn.fn(run_forward(engine.model, batch, loss_fn.outputs), batch)
        engine._nonfinite_loss = nonfinite(engine._nonfinite_loss, out)
        loss = out.loss * loss_scale if loss_scale != 1 else out.loss
        (engine.scaler.scale(loss) if engine.scaler else loss).backward()
        total.add(out)
    return total  # device tensors: the Runner reads them when the GPU is done (train/step_values.py)


@torch.no_grad()
def forward_each(engine, micro_batches: list, fn: LossFn) -> list:
    """fn of each micro-batch's outputs, no gradients, eval mode; the reference policy inside engine.reference()."""
    results = []
    with forward_module(engine, engine.model) as module, eval_mode(engine.model):
        for batch in micro_batches:
            batch = batch.to(engine.device)
            with autocast(engine.precision, engine.device):
                results.append(fn.fn(run_forward(module, batch, fn.outputs), batch))
    return results


def step_of(engine, total_norm=_local_norm) -> StepResult:
    bad_loss, engine._nonfinite_loss = engine._nonfinite_loss, False
    return clip_and_step(engine.model, engine.optimizer, engine.scheduler, engine.scaler,
                         max_grad_norm=engine.max_grad_norm, skip_nonfinite=engine.skip_nonfinite,
                         nonfinite_loss=bad_loss, total_norm=total_norm)
