"""Pipeline parallelism: the micro-batch schedule over the stages, and what a stage that computes no loss reports.

Every stage reads the same micro-batches (they are one model replica: dist.py's data-parallel group holds one
rank of each stage); the first stage embeds, each stage runs its layers on the hidden states the one before sent
it, the last computes the loss. `gpipe` runs megatron-core's forward-step and loss-function contract with
torch.distributed's send and recv, on any device (the CPU's gloo included): every micro-batch forward through the
stages, then every backward in the same order, each stage sending its input's gradient back. It keeps every
micro-batch's activations until the backward. It trains on GPUs too (schedule.py says why megatron-core's 1F1B
schedule does not), and serves the passes without gradients (evaluation, log-probs).

The last stage alone has the loss and the outputs; `from_last_stage` gives them to every stage, since the Runner
logs from rank 0, a first stage.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as tdist

from .stages import chunks_of


def _state():
    from megatron.core import parallel_state

    return parallel_state


def pipelined() -> bool:
    return _state().get_pipeline_model_parallel_world_size() > 1


def hidden_shapes(micro_batches: list, hidden_size: int, sequence_blocks: int = 1) -> list[tuple[int, int, int]]:
    """The [T, B, H] hidden states each micro-batch sends between stages (megatron-core's sequence-first layout);
    under sequence or context parallelism a rank's part of the sequence, T / `sequence_blocks`."""
    return [(b.input_ids_BT.shape[1] // sequence_blocks, b.input_ids_BT.shape[0], hidden_size)
            for b in micro_batches]


class Links:
    """Where a chunk's forward input comes from and where its output goes, as (global rank, process group): the
    stages before and after over the default group; under the interleaved schedule the last stage's hand-over to
    the first stage's next chunk (and that chunk's gradient back) over a group of its own. NCCL runs the sends and
    receives between two ranks on one communicator in the order they were issued, so at PP=2 a single
    communicator would carry both directions of a pass (0 -> 1 for a chunk, 1 -> 0 for the hand-over) and
    deadlock once a message is too large to be buffered; with the hand-over apart, each carries one."""

    def __init__(self, chunks: int):
        state = _state()
        self.chunks = chunks
        self.first, self.last = state.is_pipeline_first_stage(), state.is_pipeline_last_stage()
        self.prev = state.get_pipeline_model_parallel_prev_rank()
        self.next = state.get_pipeline_model_parallel_next_rank()
        self.handover = _handover_group() if chunks > 1 else None

    def source(self, chunk: int) -> tuple:
        return self.prev, (self.handover if self.first and chunk > 0 else None)

    def target(self, chunk: int) -> tuple:
        return self.next, (self.handover if self.last and chunk < self.chunks - 1 else None)


_HANDOVER: dict = {}


def _handover_group():
    """The process group of this pipeline's last and first stage (created once, by every rank: collective)."""
    if "group" not in _HANDOVER:
        state = _state()
        ends = (state.get_pipeline_model_parallel_first_rank(), state.get_pipeline_model_parallel_last_rank())
        every: list = [None] * tdist.get_world_size()
        tdist.all_gather_object(every, ends)
        for pair in sorted(set(every)):  # every pipeline's, in one order on every rank
            group = tdist.new_group(sorted(pair))
            if pair == ends:
                _HANDOVER["group"] = group
    return _HANDOVER["group"]


def gpipe(forward_step, micro_batches: list, model, shapes: list, *, dtype: torch.dtype, device: torch.device,
          forward_only: bool, before_last_backward=None, relay=None) -> None:
    """megatron-core's schedule contract (forward_step(data_iterator, model) -> (output, loss_func); the loss
    divided by the number of micro-batches before backward) in GPipe's order, on any device: every micro-batch
    forward through the stages, then every backward in the forwards' order; `before_last_backward()`, when given,
    is called before the last. `relay` (a router_relay.RouterLogitsRelay, training a mixture-of-experts model)
    sends and receives the router logits and their gradients after the hidden states.

    Under the interleaved schedule (virtual_pipeline_model_parallel_size) this rank holds several model chunks
    (stages.chunks_of): a micro-batch goes through chunk 0 of every stage, then chunk 1 of every stage, ... (the
    last stage's chunk v hands over to the first stage's chunk v + 1, over its own group: Links), and the ranks
    work chunk by chunk, each chunk's micro-batches in order, the backward chunks in the reverse order. Sends are
    then asynchronous (a rank sends to the one before it as well as to the one after it)."""
    chunks = chunks_of(model)
    links = Links(len(chunks))
    pending: list | None = [] if len(chunks) > 1 else None  # asynchronous sends, waited for at the end

    def send(tensor, link):
        dst, group = link
        if pending is None:
            tdist.send(tensor, dst=dst, group=group)
        else:
            pending.append((tdist.isend(tensor, dst=dst, group=group), tensor))

    def recv(tensor, link):
        src, group = link
        tdist.recv(tensor, src=src, group=group)

    if relay is not None:
        relay.links, relay.send, relay.recv = links, send, recv
    saved = []  # (chunk, micro-batch, received hidden states, output) of every forward, in order
    for v, chunk in enumerate(chunks):
        first, last = links.first and v == 0, links.last and v == len(chunks) - 1
        for index, (batch, shape) in enumerate(zip(micro_batches, shapes)):
            hidden = None
            if not first:
                hidden = torch.empty(shape, dtype=dtype, device=device)
                recv(hidden, links.source(v))
                hidden.requires_grad_(not forward_only)
                chunk.set_input_tensor(hidden)
            if relay is not None:
                relay.forward_begins(v, index)
            output, loss_func = forward_step(iter([batch]), chunk)
            if last:
                output = loss_func(output)[0] / len(shapes)
            else:
                send(output.detach().contiguous(), links.target(v))
                if relay is not None:
                    relay.forward_ends(v, index)
            if not forward_only:
                saved.append((v, index, hidden, output))
    _settle(pending)
    backward_order = sorted(saved, key=lambda item: -item[0])  # chunks from the last, micro-batches in order
    for position, (v, index, hidden, output) in enumerate(backward_order):
        first, last = links.first and v == 0, links.last and v == len(chunks) - 1
        if before_last_backward is not None and position == len(backward_order) - 1:
            before_last_backward()
        if last:
            output.backward()
        else:
            grad = torch.empty(output.shape, dtype=output.dtype, device=output.device)  # contiguous, as sent
            recv(grad, links.target(v))
            tensors, grads = relay.backward_pairs(v, index) if relay is not None else ([], [])
            torch.autograd.backward([output, *tensors], [grad, *grads])
        if not first:
            send(hidden.grad.contiguous(), links.source(v))
        if relay is not None:
            relay.backward_ends(v, index)
    _settle(pending)


def _settle(pending: list | None) -> None:
    for work, _tensor in pending or ():
        work.wait()
    if pending:
        pending.clear()


def _on_cpu(value):
    """`value` with its tensors on the CPU (dataclasses, lists, tuples and dicts looked into): what is sent to the
    other stages, which may sit on other devices."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _on_cpu(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    return value


def from_last_stage(value):
    """The last stage's `value` on every stage of this pipeline (the last stage keeps its own)."""
    if not pipelined():
        return value
    state = _state()
    box = [_on_cpu(value) if state.is_pipeline_last_stage() else None]
    tdist.broadcast_object_list(box, src=state.get_pipeline_model_parallel_last_rank(),
                                group=state.get_pipeline_model_parallel_group())
    return value if state.is_pipeline_last_stage() else box[0]
