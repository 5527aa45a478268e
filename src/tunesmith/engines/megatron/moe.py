"""Mixture-of-experts layers with transformers' routing and transformers' load-balancing loss.

megatron-core's TopKRouter computes its gate logits in its own autograd function after moving its
weight to CUDA on first use (so it cannot run on the CPU), and adds its own per-layer load-balancing
loss inside the router's backward, which is not the formula transformers (and so the other engines)
train with. The engine therefore:

- builds the MoE layers with `HFRouter` (build.py's layer spec): the gate logits as transformers'
  router computes them (`F.linear` of the hidden states, under the same autocast), on whatever device
  the weight is; megatron-core's own top-k routing then follows, configured as transformers routes
  (build.py: softmax, top-k, renormalised when norm_topk_prob; no token dropping, no capacity);
- turns megatron-core's balancing off (`moe_router_load_balancing_type: none`, coefficient 0);
- records each layer's logits during a training forward (`recorded_router_logits`) and computes
  transformers' load_balancing_loss_func over them (models/forward.py), which the loss adds with the
  model's router_aux_loss_coef and logs as `aux_loss`, as on the single engine.

Under expert parallelism the all-gather dispatcher gathers every expert-parallel rank's tokens, which
must be as many on each (an all-gather of equal shards); the ranks are data-parallel replicas reading
different micro-batches, so `EqualTokensMoELayer` pads a rank's tokens with zero rows up to the most any
rank holds, and cuts its output back. Padding rows route like any token (no capacity, no dropping:
real tokens' outputs do not depend on them) and are left out of the recorded router logits.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.router import TopKRouter

from ...models.forward import load_balancing_loss, router_aux_loss_coef, router_experts
from .sequence_parallel import gathered


class HFRouter(TopKRouter):
    """megatron-core's top-k router whose gate logits are transformers' (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: list | None = None  # a list while recorded_router_logits is active
        self.real_tokens: int | None = None  # set by EqualTokensMoELayer while padding rows follow the real ones

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        logits = F.linear(input, self.weight, self.bias)
        if self.recorded is not None:  # [tokens, experts], as transformers'
            tokens = logits.reshape(-1, logits.shape[-1])[:self.real_tokens]
            if self.config.sequence_parallel:  # every tensor-parallel rank's block of the sequence, in order
                tokens = gathered(tokens)
            self.recorded.append(tokens)
        return logits


class EqualTokensMoELayer(MoELayer):
    """megatron-core's MoE layer whose token count is the same on every expert-parallel rank (module docstring);
    with one expert-parallel rank, megatron-core's own."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        # (the engine passes no padding_mask, which would need the same padding)
        group = self.token_dispatcher.tp_ep_group
        if group is None or group.size() == 1:
            return super().forward(hidden_states, *args, **kwargs)
        length, rows, width = hidden_states.shape
        tokens = length * rows
        most = torch.tensor([tokens], device=hidden_states.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX, group=group)
        padded = torch.cat([hidden_states.reshape(tokens, 1, width),
                            hidden_states.new_zeros(int(most) - tokens, 1, width)])
        self.router.real_tokens = tokens
        try:
            output, bias = super().forward(padded, *args, **kwargs)
        finally:
            self.router.real_tokens = None
        return output[:tokens].reshape(length, rows, width), bias


@contextlib.contextmanager
def recorded_router_logits(model):
    """A list that receives every HFRouter's logits [tokens, experts] of the forwards run inside the context,
    in layer order. Outside it nothing is recorded (megatron-core's recomputation in the backward included)."""
    routers = [m for m in model.modules() if isinstance(m, HFRouter)]
    logits: list = []
    for router in routers:
        router.recorded = logits
    try:
        yield logits
    finally:
        for router in routers:
            router.recorded = None


class RouterBalancing:
    """transformers' load-balancing loss of the Hugging Face model `hf_model` and its coefficient."""

    def __init__(self, hf_model, coef: float):
        self.hf_model, self.coef = hf_model, coef
        self.num_experts = router_experts(hf_model)

    @classmethod
    def of(cls, hf_model) -> "RouterBalancing | None":
        """None for a model whose forward returns no router loss (dense models)."""
        coef = router_aux_loss_coef(hf_model)
        return None if coef is None else cls(hf_model, coef)

    def loss(self, router_logits: list) -> torch.Tensor:
        return load_balancing_loss(self.hf_model, tuple(router_logits))
