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


def _state():
    from megatron.core import parallel_state

    return parallel_state


def stage_router_counts(model) -> list[int]:
    """The number of routers (MoE layers) on each pipeline stage, the same list on every stage."""
    state = _state()
    counts: list = [None] * state.get_pipeline_model_parallel_world_size()
    own = sum(isinstance(m, HFRouter) for m in model.modules())
    tdist.all_gather_object(counts, own, group=state.get_pipeline_model_parallel_group())
    return counts


class RouterLogitsRelay:
    """One training step's relay over pipeline stages (module docstring). `tokens`: each micro-batch's tokens
    (rows x length); `counts`: stage_router_counts."""

    def __init__(self, tokens: list[int], counts: list[int], experts: int, dtype: torch.dtype,
                 device: torch.device):
        state = _state()
        stage = state.get_pipeline_model_parallel_rank()
        self.first, self.last = state.is_pipeline_first_stage(), state.is_pipeline_last_stage()
        self.prev = state.get_pipeline_model_parallel_prev_rank()
        self.next = state.get_pipeline_model_parallel_next_rank()
        self.before, self.own_count = sum(counts[:stage]), counts[stage]
        self.tokens, self.experts, self.dtype, self.device = tokens, experts, dtype, device
        self.received: dict[int, torch.Tensor] = {}  # micro-batch -> the earlier layers' logits
        self.own: dict[int, torch.Tensor] = {}  # micro-batch -> this stage's logits, in the autograd graph
        self.index = 0

    def _empty(self, layers: int, index: int) -> torch.Tensor:
        return torch.empty(layers, self.tokens[index], self.experts, dtype=self.dtype, device=self.device)

    def forward_begins(self, index: int) -> None:
        """Before micro-batch `index`'s forward on this stage (after its hidden states arrived)."""
        self.index = index
        if self.before:
            received = self._empty(self.before, index)
            tdist.recv(received, src=self.prev)
            self.received[index] = received.requires_grad_(self.last)

    def layers(self, own: list) -> list | None:
        """Every layer's logits of this micro-batch in layer order, this stage's `own` in the autograd graph, on
        the last stage (which computes the loss); None on the others (which keep `own` for their backward)."""
        if not self.last:
            self.own[self.index] = torch.stack(own) if own else None
            return None
        earlier = self.received.get(self.index)
        return [*(earlier.unbind(0) if earlier is not None else ()), *own]

    def forward_ends(self, index: int) -> None:
        """After micro-batch `index`'s hidden states went to the next stage (not on the last stage)."""
        parts = [t.detach().to(self.dtype) for t in (self.received.pop(index, None), self.own.get(index)) if t is not None]
        if parts:
            tdist.send(torch.cat(parts).contiguous(), dst=self.next)

    def backward_pairs(self, index: int) -> tuple[list, list]:
        """Tensors and gradients to add to micro-batch `index`'s backward on a stage before the last: its own
        routers' logits and their gradients from the stages after it (the earlier layers' are kept to send)."""
        if not self.before + self.own_count:
            return [], []
        grads = self._empty(self.before + self.own_count, index)
        tdist.recv(grads, src=self.next)
        self.received[index] = grads[:self.before]
        own = self.own.pop(index)
        return ([own], [grads[self.before:]]) if own is not None else ([], [])

    def backward_ends(self, index: int) -> None:
        """After micro-batch `index`'s backward on this stage: the earlier layers' gradients to the stage before."""
        if self.first or not self.before:
            return
        held = self.received.pop(index)
        grads = held.grad if self.last else held
        if grads is None:  # the loss method left the router loss out (it uses no aux_loss)
            grads = torch.zeros_like(held)
        tdist.send(grads.contiguous(), dst=self.prev)
