"""The forward passes a method can ask an engine for, and the outputs they give.

Methods name what they need (`Method.outputs`): "logits", "nll" (the summed
next-token NLL from a fused linear+CE head when one is installed, else logits)
or "rewards" (a reward model's scalar per row). Engines call `run_forward`; no
method calls the model itself, so an engine may run the forward inside its own
schedule (pipeline parallelism) or on other weights (the reference view).

A mixture-of-experts model whose forward can return its router load-balancing
loss (`output_router_logits`, weighted by `config.router_aux_loss_coef`: Qwen3-MoE,
GPT-OSS, Mixtral, ...) is asked for it in training forwards (gradients on, train
mode), as LLaMA-Factory does; the outputs then carry `aux_loss` and its
coefficient for the loss to add. Evaluation and no-gradient passes never ask.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from .attention import boundaries_given
from .inputs import model_inputs

OutputKind = Literal["logits", "nll", "rewards"]


@dataclass
class ModelOutputs:
    logits_BTV: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None  # fused head: the NLL summed over the batch's label tokens
    rewards_B: torch.Tensor | None = None
    # MoE: the router load-balancing loss of this micro-batch as transformers returns it (unscaled), and
    # the weight the model's config gives it; None / 0.0 for dense models and passes without gradients.
    aux_loss: torch.Tensor | None = None
    aux_loss_coef: float = 0.0


@dataclass(frozen=True)
class LossFn:
    """What to compute from a micro-batch: the outputs to produce, then fn(outputs, batch). Engines run it
    (`forward_backward` for losses, `forward` for values without gradients)."""

    outputs: OutputKind
    fn: Callable[[ModelOutputs, object], object]


def base_model(model):
    """The model under a PEFT wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def fused_loss_head(model):
    """The output layer when a fused loss head is installed on it (models.kernels.install_loss_head), else None."""
    head = base_model(model).get_output_embeddings()
    return head if hasattr(head, "loss_targets") else None


def run_forward(model, batch, kind: OutputKind) -> ModelOutputs:
    if kind == "rewards":
        return ModelOutputs(rewards_B=sequence_rewards(model, batch))
    inputs = model_inputs(model, batch)
    coef = router_aux_loss_coef(model) if torch.is_grad_enabled() and model.training else None
    if coef is not None:
        inputs["output_router_logits"] = True
    head = fused_loss_head(model) if kind == "nll" else None
    given = boundaries_given() if inputs.get("packed_cu_seqlens") is not None else contextlib.nullcontext()
    if head is None:
        with given:
            out = model(**inputs)
        return _with_aux(ModelOutputs(logits_BTV=out.logits), out, coef)
    head.loss_targets, head.loss_rows = batch.targets_BT.reshape(-1), getattr(batch, "counted_rows", None)
    try:
        with given:
            out = model(**inputs)
        return _with_aux(ModelOutputs(nll_sum=out.logits), out, coef)  # the head returned the NLL sum
    finally:
        head.loss_targets = head.loss_rows = None


def router_aux_loss_coef(model) -> float | None:
    """The weight of the model's router load-balancing loss when its forward can return one, else None."""
    base = base_model(model)  # the module's own forward (through wrappers such as DeepSpeed's, which forward getattr)
    config = getattr(base, "config", None)
    coef = getattr(config, "router_aux_loss_coef", None)
    if coef is None and hasattr(config, "get_text_config"):  # Qwen3-VL MoE keeps it in its text config
        coef = getattr(config.get_text_config(), "router_aux_loss_coef", None)
    if coef is None or "output_router_logits" not in inspect.signature(base.forward).parameters:
        return None
    return float(coef)


def router_experts(model) -> int | None:
    """The number of experts each router chooses from (None for a dense model)."""
    config = base_model(model).config.get_text_config()
    return getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)  # 5.25, older


def load_balancing_loss(model, router_logits: tuple) -> torch.Tensor:
    """The router load-balancing loss that `model`'s own forward returns (`aux_loss`), computed by its modeling
    module's load_balancing_loss_func over `router_logits` (one [tokens, experts] tensor per layer), without an
    attention mask as run_forward's training forwards: for an engine that runs the layers itself (Megatron)."""
    import sys

    from ..errors import ModelError

    base = base_model(model)
    fn = getattr(sys.modules[type(base).__module__], "load_balancing_loss_func", None)
    config = base.config.get_text_config()
    num_experts = router_experts(model)
    if fn is None or not num_experts:
        raise ModelError(f"{type(base).__name__}'s module has no load_balancing_loss_func (or its config no expert "
                         "count), so its router loss cannot be computed outside its forward; use backend: single")
    return fn(router_logits, num_experts, config.num_experts_per_tok, None)


def _with_aux(outputs: ModelOutputs, model_output, coef: float | None) -> ModelOutputs:
    aux = getattr(model_output, "aux_loss", None) if coef is not None else None
    if aux is not None:
        outputs.aux_loss, outputs.aux_loss_coef = aux, coef
    return outputs


def last_token_index(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real (non-padding) token, under left or right padding."""
    positions = torch.arange(segment_ids_BT.shape[1], device=segment_ids_BT.device).expand_as(segment_ids_BT)
    return torch.where(segment_ids_BT >= 0, positions, -1).max(-1).values


def sequence_rewards(model, batch) -> torch.Tensor:
    """One scalar per row: the score head at the row's last real token, so left and right padding agree."""
    base = base_model(model)
    hidden = base.model(**model_inputs(base, batch)).last_hidden_state
    last = last_token_index(batch.segment_ids_BT)
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return base.score(picked).squeeze(-1).float()
