"""The optimiser step shared by the engines that run torch's optimizer themselves (single, fsdp2)."""

from __future__ import annotations

import math

import torch

from ..models.forward import run_forward
from .base import LossFn, NonFiniteError, StepOutput, StepResult, eval_mode, forward_module, nonfinite


def _local_norm(params: list) -> torch.Tensor:
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])


def clip_and_step(model, optimizer, scheduler, scaler, *, max_grad_norm: float, skip_nonfinite: bool,
                  nonfinite_loss: bool, total_norm=_local_norm) -> StepResult:
    """Unscale (fp16), clip, refuse or skip a non-finite step, update, schedule, zero the gradients.
    `total_norm(params)`: the gradients' norm (an engine whose parameters are shards gives the whole model's)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if scaler:
        scaler.unscale_(optimizer)
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    grad_norm = _clip(params, optimizer, max_norm, fold_into_step=scaler is None, total_norm=total_norm)
    lr = scheduler.get_last_lr()[0]
    if (nonfinite_loss or not math.isfinite(grad_norm)) and scaler is None:
        optimizer.zero_grad(set_to_none=True)
        if not skip_nonfinite:
            raise NonFiniteError(f"non-finite loss or gradient (grad norm {grad_norm})")
        return StepResult(grad_norm, True, lr)
    if scaler:
        scaler.step(optimizer)  # skips the update itself on inf/nan
        scaler.update()
    else:
        optimizer.step()
        optimizer.grad_scale = None
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(grad_norm, False, lr)


def _clip(params: list, optimizer, max_norm: float, fold_into_step: bool, total_norm=_local_norm) -> float:
    """The gradients' total norm, and the gradients scaled to at most max_norm, as clip_grad_norm_ does. The norm
    is read on the host anyway (logging, the non-finite check), so nothing is scaled when it is within the bound,
    and a fused AdamW divides by the clipping factor inside its own update (its `grad_scale`, the hook AMP uses)
    rather than in a separate pass over every gradient."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = total_norm(params)
    grad_norm = float(total)
    if not math.isfinite(grad_norm) or grad_norm <= max_norm:
        return grad_norm
    if fold_into_step and optimizer.defaults.get("fused") and type(total) is torch.Tensor:  # not FSDP2's DTensors
        optimizer.grad_scale = (total + 1e-6) / max_norm
    else:
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
    return total.settle()


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
    bad_loss, engine._nonfinite_loss = bool(engine._nonfinite_loss), False
    return clip_and_step(engine.model, engine.optimizer, engine.scheduler, engine.scaler,
                         max_grad_norm=engine.max_grad_norm, skip_nonfinite=engine.skip_nonfinite,
                         nonfinite_loss=bad_loss, total_norm=total_norm)
