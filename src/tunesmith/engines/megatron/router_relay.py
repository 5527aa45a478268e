"""A mixture-of-experts model's router logits carried over pipeline stages, for transformers' load-balancing loss.

transformers' load-balancing loss is one function of every layer's router logits (means over all layers and
tokens, multiplied: models/forward.load_balancing_loss), not a sum of per-layer terms, so a stage cannot compute
a share of it from its own layers. `RouterLogitsRelay` carries the logits along the pipeline with the hidden
states, inside pipeline.gpipe:

- forward: each stage receives the logits of the layers before it (one [layers, tokens, experts] tensor per
  micro-batch) and sends them on with its own, detached; the last stage computes the whole model's loss from
  them, the received ones as leaves that collect their gradients in its backward;
- backward: with the hidden states' gradient the last stage sends back those gradients; each stage runs its
  own routers' backward with its rows and sends the rest on.

The loss value, logged by the last stage, and every router's gradient are then those of the whole model in one
process, whatever the loss method does with the term (an unused one sends zeros). The cost per micro-batch and
stage: the logits of the layers before it, [layers, tokens, experts] in the compute dtype, each way.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from .moe import HFRouter
from .stages import chunks_of


def _state():
    from megatron.core import parallel_state

    return parallel_state


def stage_router_counts(model) -> list[int]:
    """The number of routers (MoE layers) of each pipeline stage in the model's order, the same list on every
    stage: under the interleaved schedule each virtual stage's (chunk v of stage s is virtual stage v x PP + s)."""
    state = _state()
    per_rank: list = [None] * state.get_pipeline_model_parallel_world_size()
    own = [sum(isinstance(m, HFRouter) for m in chunk.modules()) for chunk in chunks_of(model)]
    tdist.all_gather_object(per_rank, own, group=state.get_pipeline_model_parallel_group())
    return [counts[v] for v in range(len(own)) for counts in per_rank]


class RouterLogitsRelay:
    """One training step's relay over pipeline stages (module docstring). `tokens`: each micro-batch's tokens
    (rows x length); `counts`: stage_router_counts. A micro-batch on a chunk is keyed (chunk, micro-batch).
    pipeline.gpipe sets `links` (pipeline.Links), `send` and `recv` (its own: the hidden states' ways)."""

    def __init__(self, tokens: list[int], counts: list[int], experts: int, dtype: torch.dtype,
                 device: torch.device):
        state = _state()
        self.stage = state.get_pipeline_model_parallel_rank()
        self.stages = state.get_pipeline_model_parallel_world_size()
        self.counts = counts
        self.links = self.send = self.recv = None  # pipeline.gpipe's
        self.tokens, self.experts, self.dtype, self.device = tokens, experts, dtype, device
        self.received: dict[tuple, torch.Tensor] = {}  # (chunk, micro-batch) -> the earlier layers' logits
        self.own: dict[tuple, torch.Tensor] = {}  # (chunk, micro-batch) -> this chunk's logits, in the graph
        self.key = (0, 0)

    def _position(self, chunk: int) -> int:
        return chunk * self.stages + self.stage

    def _before(self, chunk: int) -> int:
        return sum(self.counts[:self._position(chunk)])

    def _last(self, chunk: int) -> bool:
        return self._position(chunk) == len(self.counts) - 1

    def _empty(self, layers: int, index: int) -> torch.Tensor:
        return torch.empty(layers, self.tokens[index], self.experts, dtype=self.dtype, device=self.device)

    def forward_begins(self, chunk: int, index: int) -> None:
        """Before micro-batch `index`'s forward on this chunk (after its hidden states arrived)."""
        self.key, before = (chunk, index), self._before(chunk)
        if before:
            received = self._empty(before, index)
            self.recv(received, self.links.source(chunk))
            self.received[self.key] = received.requires_grad_(self._last(chunk))

    def layers(self, own: list) -> list | None:
        """Every layer's logits of this micro-batch in layer order, this chunk's `own` in the autograd graph, on
        the last stage (which computes the loss); None on the others (which keep `own` for their backward)."""
        if not self._last(self.key[0]):
            self.own[self.key] = torch.stack(own) if own else None
            return None
        earlier = self.received.get(self.key)
        return [*(earlier.unbind(0) if earlier is not None else ()), *own]

    def forward_ends(self, chunk: int, index: int) -> None:
        """After micro-batch `index`'s hidden states went on from this chunk (not the last stage's last)."""
        parts = [t.detach().to(self.dtype) for t in (self.received.pop((chunk, index), None),
                                                      self.own.get((chunk, index))) if t is not None]
        if parts:
            self.send(torch.cat(parts).contiguous(), self.links.target(chunk))

    def backward_pairs(self, chunk: int, index: int) -> tuple[list, list]:
        """Tensors and gradients to add to micro-batch `index`'s backward on a chunk before the last: its own
        routers' logits and their gradients from the stages after it (the earlier layers' are kept to send)."""
        before, own_count = self._before(chunk), self.counts[self._position(chunk)]
        if not before + own_count:
            return [], []
        grads = self._empty(before + own_count, index)
        self.recv(grads, self.links.target(chunk))
        self.received[(chunk, index)] = grads[:before]
        own = self.own.pop((chunk, index))
        return ([own], [grads[before:]]) if own is not None else ([], [])

    def backward_ends(self, chunk: int, index: int) -> None:
        """After micro-batch `index`'s backward on this chunk: the earlier layers' gradients to the stage before."""
        if not self._before(chunk):
            return
        held = self.received.pop((chunk, index))
        grads = held.grad if self._last(chunk) else held
        if grads is None:  # the loss method left the router loss out (it uses no aux_loss)
            grads = torch.zeros_like(held)
        self.send(grads.contiguous(), self.links.source(chunk))
