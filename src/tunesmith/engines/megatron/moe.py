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
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.router import TopKRouter

from ...models.forward import load_balancing_loss, router_aux_loss_coef


class HFRouter(TopKRouter):
    """megatron-core's top-k router whose gate logits are transformers' (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: list | None = None  # a list while recorded_router_logits is active

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        logits = F.linear(input, self.weight, self.bias)
        if self.recorded is not None:
            self.recorded.append(logits.reshape(-1, logits.shape[-1]))  # [tokens, experts], as transformers'
        return logits


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

    @classmethod
    def of(cls, hf_model) -> "RouterBalancing | None":
        """None for a model whose forward returns no router loss (dense models)."""
        coef = router_aux_loss_coef(hf_model)
        return None if coef is None else cls(hf_model, coef)

    def loss(self, router_logits: list) -> torch.Tensor:
        return load_balancing_loss(self.hf_model, tuple(router_logits))
