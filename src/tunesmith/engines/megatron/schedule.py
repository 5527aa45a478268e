"""The micro-batch schedule: megatron-core's forward-backward function, and the loss scale it needs.

megatron-core's schedules divide each micro-batch's loss by the number of micro-batches (its
legacy averaging: the loss function returns (loss, reduced)). tunesmith's losses are already
divided by the normaliser of the whole optimiser step (the Runner's label tokens, pairs, ...),
so the loss handed to the schedule is multiplied by the number of micro-batches, and the
gradients come out as the plain sum over micro-batches that the normaliser expects.

Without pipeline stages the engine runs megatron-core's no-pipelining schedule on CUDA; it allocates on
CUDA, so on the CPU the same forward-step and loss functions run through `local_schedule`, which does
what it does (forward, divide by the micro-batch count, backward). Over pipeline stages the micro-batches
run through pipeline.gpipe on every device: on two H200s megatron-core's 1F1B schedule gave other
losses than one process from the first step on (a 4-layer Qwen3, PP=2, unpacked rows: 12.139 against
12.232, and 8.3 against 3.4 after 20 steps), where gpipe gives one process's curve within 0.1%
(benchmarks/results/2026-12-04-megatron-2gpu.md). GPipe holds every micro-batch's activations of the
step until its backward, where 1F1B holds at most one per stage.

A mixture-of-experts model's router load-balancing loss (transformers' formula, moe.py) is computed in
the forward step from the routers' logits and handed to the loss with the model's coefficient, as the
single engine's forward hands it; over pipeline stages the last stage computes it from every stage's logits,
which router_relay.py carries along the pipeline (and their gradients back).
"""

from __future__ import annotations

import functools

import torch

from ..base import LossFn, StepOutput, nonfinite
from ..local_step import autocast
from .context_parallel import local_batch, router_loss_share, splits_loss, summed_over_context
from .forward import as_outputs, stage_forward
from .pipeline import from_last_stage, gpipe, hidden_shapes, pipelined


def scheduled_loss(loss: torch.Tensor, num_microbatches: int) -> torch.Tensor:
    """The loss to give megatron-core's schedule so that after its division by num_microbatches it is `loss`."""
    return loss * num_microbatches


def _loss_func(engine, loss_fn: LossFn, batch, total: StepOutput, num_microbatches: int, aux_loss, output):
    # under the same autocast as the forward, as the other engines compute the loss (cross-entropy in fp32)
    batch = local_batch(batch) if splits_loss(loss_fn.outputs) else batch  # this rank's tokens (context_parallel.py)
    with autocast(engine.precision, engine.device):
        outputs = as_outputs(output, loss_fn.outputs, engine.model, batch)
        if aux_loss is not None:
            outputs.aux_loss, outputs.aux_loss_coef = aux_loss, engine.balancing.coef
        out = loss_fn.fn(outputs, batch)
    engine._nonfinite_loss = nonfinite(engine._nonfinite_loss, out)
    total.add(out)
    return scheduled_loss(out.loss, num_microbatches), {}


def forward_step_func(engine, loss_fn: LossFn, total: StepOutput, num_microbatches: int, relay=None):
    """megatron-core's forward_step_func(data_iterator, model) -> (output, loss_func); `relay`: pipeline.gpipe's."""
    def forward_step(data_iterator, model):
        batch = next(data_iterator).to(engine.device)
        with autocast(engine.precision, engine.device):
            output, aux_loss = _forward_with_aux(engine, model, batch, loss_fn.outputs, relay)
        return output, functools.partial(_loss_func, engine, loss_fn, batch, total, num_microbatches, aux_loss)
    return forward_step


def _forward_with_aux(engine, model, batch, kind: str, relay=None):
    """The stage's output (logits, or a reward model's [B]) and, for a mixture-of-experts model, transformers'
    load-balancing loss over this forward's router logits (moe.py), as the single engine's training forward
    returns it (reward forwards ask for none there either); over pipeline stages the last stage's, of every
    stage's logits (`relay`), and None on the others."""
    if not _balances(engine, kind):
        return stage_forward(model, batch, kind, engine.angles), None
    from .moe import recorded_router_logits

    with recorded_router_logits(model) as router_logits:
        output = stage_forward(model, batch, kind, engine.angles)
    layers = router_logits if relay is None else relay.layers(router_logits)
    return output, None if layers is None else router_loss_share(engine.balancing.loss, layers)


def _balances(engine, kind: str) -> bool:
    """Whether this training forward adds the router load-balancing loss."""
    return engine.balancing is not None and kind != "rewards"


def _relay(engine, micro_batches: list, kind: str):
    """The router logits' relay over pipeline stages (router_relay.py) for a step that adds the router loss."""
    if not _balances(engine, kind):
        return None
    from .router_relay import RouterLogitsRelay

    dtype = torch.float32 if engine.precision == "fp32" else torch.bfloat16  # the routers' logits: compute dtype
    cp = engine.model.config.context_parallel_size  # each rank routes its part of the rows (context_parallel.py)
    return RouterLogitsRelay([b.input_ids_BT.numel() // cp for b in micro_batches], engine.router_counts,
                             engine.balancing.num_experts, dtype, engine.device)


def local_schedule(forward_step, data_iterator, model, num_microbatches: int) -> None:
    """megatron-core's no-pipelining schedule, on any device."""
    for _ in range(num_microbatches):
        output, loss_func = forward_step(data_iterator, model)
        loss, _ = loss_func(output)
        (loss / num_microbatches).backward()


def _sequence_blocks(config) -> int:
    """How many blocks a row's sequence is cut into over the ranks: 2 per context-parallel rank
    (context_parallel.py), each cut again over the tensor-parallel ranks under sequence parallelism."""
    cp = config.context_parallel_size
    return (2 * cp if cp > 1 else 1) * (config.tensor_model_parallel_size if config.sequence_parallel else 1)


def _sequence_sized(module, micro_batches: list) -> list:
    """Each micro-batch's rows padded to a multiple of _sequence_blocks (sequence_parallel.py); the micro-batches
    as they are when the sequence is not cut."""
    blocks = _sequence_blocks(module.config)
    if blocks == 1:
        return micro_batches
    from .sequence_parallel import padded_rows

    pad_id = getattr(module, "padding_idx", None) or 0  # (its positions reach no loss: any id does)
    return [padded_rows(b, blocks, pad_id) for b in micro_batches]


def _gpipe(engine, forward_step, module, micro_batches: list, *, forward_only: bool, relay=None) -> None:
    config = module.config
    overlapped = None if forward_only else engine.overlapped
    rank_blocks = config.context_parallel_size * (config.tensor_model_parallel_size if config.sequence_parallel else 1)
    shapes = hidden_shapes(micro_batches, config.hidden_size, rank_blocks)
    gpipe(forward_step, micro_batches, module, shapes,
          dtype=config.pipeline_dtype, device=engine.device, forward_only=forward_only,
          before_last_backward=overlapped.arm if overlapped is not None else None, relay=relay)


def run_forward_backward(engine, micro_batches: list, loss_fn: LossFn) -> StepOutput:
    """gpipe over pipeline stages; else megatron-core's no-pipelining schedule on CUDA, local_schedule on the CPU.
    Every stage returns the last stage's sums."""
    total = StepOutput()
    count = len(micro_batches)
    micro_batches = _sequence_sized(engine.model, micro_batches)
    engine.model.train()
    if pipelined():
        relay = _relay(engine, micro_batches, loss_fn.outputs)
        step = forward_step_func(engine, loss_fn, total, count, relay)
        _gpipe(engine, step, engine.model, micro_batches, forward_only=False, relay=relay)
        return from_last_stage(_whole_step(total, loss_fn, engine).settle())
    step = forward_step_func(engine, loss_fn, total, count)
    # megatron-core's schedule multiplies a (loss, reduced) loss by the context-parallel degree before its backward;
    # a context-parallel rank's loss here is already its share, so those runs take local_schedule
    if engine.device.type == "cuda" and engine.model.config.context_parallel_size == 1:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        lengths = [b.input_ids_BT.shape for b in micro_batches]
        get_forward_backward_func()(forward_step_func=step, data_iterator=_arming(micro_batches, engine.overlapped),
                                    model=[engine.model], num_microbatches=count,
                                    seq_length=max(s[1] for s in lengths), micro_batch_size=max(s[0] for s in lengths),
                                    forward_only=False)
    else:
        local_schedule(step, _arming(micro_batches, engine.overlapped), engine.model, count)
    return _whole_step(total, loss_fn, engine).settle()


def _whole_step(total: StepOutput, loss_fn: LossFn, engine) -> StepOutput:
    """The step's sums over every token: under context parallelism with a loss split over the ranks' tokens, the
    ranks' shares added up (context_parallel.py)."""
    return summed_over_context(total, engine.device) if splits_loss(loss_fn.outputs) else total


def _arming(micro_batches: list, overlapped):
    """The micro-batches, one by one; `overlapped` (overlap.py) armed as the last is taken: the schedule runs each
    micro-batch's backward before it takes the next, so the last one's backward is the step's last."""
    for index, batch in enumerate(micro_batches):
        if overlapped is not None and index == len(micro_batches) - 1:
            overlapped.arm()
        yield batch


def forward_values(engine, module, micro_batches: list, fn: LossFn) -> list:
    """fn of each micro-batch's outputs, without gradients (the caller's no_grad and eval mode): one forward each,
    or through the pipeline stages (gpipe), the last stage's values given to every stage."""
    values = []
    micro_batches = _sequence_sized(module, micro_batches)

    def forward_step(data_iterator, model):
        batch = next(data_iterator).to(engine.device)
        with autocast(engine.precision, engine.device):
            output = stage_forward(model, batch, fn.outputs, engine.angles)

        def value_func(output):
            split = splits_loss(fn.outputs)
            mine = local_batch(batch) if split else batch
            with autocast(engine.precision, engine.device):
                value = fn.fn(as_outputs(output, fn.outputs, model, mine), mine)
            values.append(summed_over_context(value, engine.device) if split else value)
            return output.new_zeros(()), {}
        return output, value_func

    if pipelined():
        _gpipe(engine, forward_step, module, micro_batches, forward_only=True)
        return from_last_stage(values)
    batches = iter(micro_batches)
    for _ in micro_batches:
        output, value_func = forward_step(batches, module)
        value_func(output)
    return values
