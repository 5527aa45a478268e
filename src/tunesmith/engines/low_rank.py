"""GaLore and APOLLO (LLaMA-Factory's use_galore / use_apollo): AdamW whose moments live in a low-rank projection
of each target weight's gradient (the galore-torch and apollo-torch packages, as LLaMA-Factory builds them).

galore_layerwise / apollo_layerwise step each parameter in its backward pass (PerParameterSteps).

Their state keeps each weight's projector as a Python object; tunesmith's checkpoints load weights_only (tensors,
numbers, strings: never code), so state_dict writes a projector as its attributes and load_state_dict rebuilds it
from a class named in PROJECTORS, nothing else."""

from __future__ import annotations

import importlib
import logging

import torch

from ..errors import TunesmithError

log = logging.getLogger("tunesmith")

# The projector classes a checkpoint may name: (module, class).
PROJECTORS = {"galore": ("galore_torch.galore_projector", "GaLoreProjector"),
              "apollo_random": ("apollo_torch.random_projector", "GradientProjector"),
              "apollo_svd": ("apollo_torch.svd_projector", "GaLoreProjector")}
_KEY = "projector"


def _named(projector) -> str:
    cls = type(projector)
    for name, (module, qualname) in PROJECTORS.items():
        if cls.__module__ == module and cls.__name__ == qualname:
            return name
    raise TunesmithError(f"{cls.__module__}.{cls.__name__}: a projector tunesmith cannot checkpoint")


def _plain(projector) -> dict:
    return {"class": _named(projector), **vars(projector)}


def _rebuilt(saved: dict, device: torch.device):
    name = saved.get("class")
    if name not in PROJECTORS:
        raise TunesmithError(f"the checkpoint's optimizer state names the projector {name!r}, not one of "
                             f"{sorted(PROJECTORS)}; resume from another checkpoint")
    module, qualname = PROJECTORS[name]
    projector = object.__new__(getattr(importlib.import_module(module), qualname))
    projector.__dict__.update({k: _to(v, device) for k, v in saved.items() if k != "class"})
    return projector


def _to(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return [_to(v, device) for v in value] if isinstance(value, (list, tuple)) else value


class PlainProjectorState:
    """Mixed into GaLore's / APOLLO's AdamW: the projectors in state_dict as plain values. They are set aside while
    torch's load_state_dict casts the rest (it would iterate their strings as sequences)."""

    def state_dict(self):
        state = super().state_dict()
        state["state"] = {index: {k: _plain(v) if k == _KEY else v for k, v in entry.items()}
                          for index, entry in state["state"].items()}
        return state

    def load_state_dict(self, state_dict):
        projectors = {index: entry[_KEY] for index, entry in state_dict["state"].items() if _KEY in entry}
        rest = {index: {k: v for k, v in entry.items() if k != _KEY} for index, entry in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": rest})
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in projectors.items():
            if not isinstance(saved, dict) or not 0 <= index < len(params):
                raise TunesmithError(f"the checkpoint's optimizer state holds a malformed projector (parameter "
                                     f"{index}); resume from another checkpoint")
            self.state[params[index]][_KEY] = _rebuilt(saved, params[index].device)

    def settle_settings(self) -> None:
        """After this run's group settings are put back (engines/base.load_own_optimizer): the projectors take the
        group's scale and update interval."""
        for group in self.param_groups:
            for param in group["params"]:
                projector = self.state.get(param, {}).get(_KEY)
                if projector is not None:
                    projector.scale, projector.update_proj_gap = group["scale"], group["update_proj_gap"]


def _optimizer_class(kind: str):
    try:
        if kind == "galore":
            from galore_torch import GaLoreAdamW as base
        else:
            from apollo_torch import APOLLOAdamW as base
    except ImportError:
        raise TunesmithError(f"use_{kind} needs the {kind}-torch package: pip install 'tunesmith[{kind}]'") from None
    return type(f"Checkpointable{base.__name__}", (PlainProjectorState, base), {})


def projected_weights(model, wanted: list[str]) -> set[int]:
    """The trainable 2-D weights of the linear layers `wanted` names (`all`: every one but the output head)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    chosen = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        if "all" in wanted or any(target in name for target in wanted):
            chosen.update(id(p) for p in module.parameters() if p.requires_grad and p.ndim > 1)
    return chosen


def build_low_rank(model, cfg, decays) -> torch.optim.Optimizer:
    """GaLore's or APOLLO's AdamW: the target weights in one group with the projection settings and weight decay,
    the other parameters in groups with and without weight decay (`decays(name, param)`, engines/optim's)."""
    kind = "galore" if cfg.use_galore else "apollo"
    chosen = projected_weights(model, cfg.galore_target if kind == "galore" else cfg.apollo_target)
    if not chosen:
        raise TunesmithError(f"{kind}_target matches no trainable linear layer; use all, or names of linear layers")
    plain: dict[bool, list] = {True: [], False: []}
    projected = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (projected if id(param) in chosen else plain[decays(name, param)]).append(param)
    if kind == "galore":
        settings = {"rank": cfg.galore_rank, "update_proj_gap": cfg.galore_update_interval,
                    "scale": cfg.galore_scale, "proj_type": cfg.galore_proj_type}
    else:
        settings = {"rank": cfg.apollo_rank, "proj": cfg.apollo_proj, "proj_type": cfg.apollo_proj_type,
                    "update_proj_gap": cfg.apollo_update_interval, "scale": cfg.apollo_scale,
                    "scale_type": cfg.apollo_scale_type}
    groups = [{"params": plain[False], "weight_decay": 0.0}, {"params": plain[True], "weight_decay": cfg.weight_decay},
              {"params": projected, "weight_decay": cfg.weight_decay, **settings}]
    groups = [g for g in groups if g["params"]]
    layerwise = cfg.galore_layerwise if kind == "galore" else cfg.apollo_layerwise
    log.info("%s%s: %d weight matrices projected (%s), %d other parameters", "GaLore" if kind == "galore" else
             "APOLLO", " per layer (each parameter updated in the backward pass)" if layerwise else "", len(projected),
             ", ".join(f"{k} {v}" for k, v in settings.items()), len(plain[True]) + len(plain[False]))
    # apollo-torch reads scale_front from the optimizer, not a group (LLaMA-Factory sets it in the group)
    extra = {"no_deprecation_warning": True} if kind == "galore" else {"scale_front": cfg.apollo_scale_front}

    def optimizer(of_groups: list[dict]):
        return _optimizer_class(kind)(of_groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                      eps=cfg.adam_epsilon, **extra)

    if layerwise:
        if cfg.max_grad_norm > 0:
            log.warning("%s_layerwise: each parameter is updated in its backward pass, before the whole gradient's "
                        "norm is known, so max_grad_norm (%g) clips nothing (as in LLaMA-Factory); the logged "
                        "grad_norm is the unclipped one", kind, cfg.max_grad_norm)
        steps = PerParameterSteps([{**group, "params": [param]} for group in groups for param in group["params"]],
                                  optimizer)
        if kind == "apollo":  # its random projections are seeded by the parameter's place among all of them
            for place, group in enumerate(steps.param_groups, 1):
                steps.state[group["params"][0]]["seed"] = place
        return steps
    return optimizer(groups)


class PerParameterSteps(PlainProjectorState, torch.optim.Optimizer):
    """galore_layerwise / apollo_layerwise (LLaMA-Factory's per-layer mode): an optimizer of one parameter per
    group, stepped by the parameter's post-accumulate-grad hook during the backward pass, which frees the gradient
    right after, so the full gradients are never held at once. Nothing is left for step(): the engine reads the
    gradient norm the hooks summed (steps_in_backward; no clipping, as in LLaMA-Factory). The groups and state
    are this optimizer's, shared with the per-parameter ones, so the LR schedule and checkpoints see one
    optimizer."""

    steps_in_backward = True

    def __init__(self, groups: list[dict], optimizer):
        self.parts = [optimizer([group]) for group in groups]
        super().__init__([part.param_groups[0] for part in self.parts], {})
        for part in self.parts:  # what a part set up at construction (APOLLO's random-projection seeds)
            self.state.update(part.state)
        self._share()
        self.by_param = {id(part.param_groups[0]["params"][0]): part for part in self.parts}
        self.updated: set[int] = set()
        self.squared_norm = None
        for group in self.param_groups:
            group["params"][0].register_post_accumulate_grad_hook(self._update)

    def _share(self) -> None:
        for part, group in zip(self.parts, self.param_groups):
            part.param_groups, part.state = [group], self.state

    @torch.no_grad()
    def _update(self, param) -> None:
        if id(param) in self.updated:
            raise TunesmithError("galore_layerwise / apollo_layerwise update each parameter in its backward pass, "
                                 "once a step, but this step ran a second backward pass (gradient accumulation or "
                                 "several passes a step); use gradient_accumulation_steps: 1, or the layerwise key "
                                 "false")
        self.updated.add(id(param))
        squared = param.grad.detach().float().square().sum()
        self.squared_norm = squared if self.squared_norm is None else self.squared_norm + squared
        self.by_param[id(param)].step()
        param.grad = None

    def step(self, closure=None):
        raise TunesmithError("per-layer GaLore / APOLLO update in the backward pass; the engine calls finish_step()")

    def finish_step(self) -> torch.Tensor:
        """The step's gradient norm (a device tensor; 0 when no gradient reached a hook); the next step may update
        every parameter again."""
        norm = torch.zeros(()) if self.squared_norm is None else self.squared_norm.sqrt()
        self.updated, self.squared_norm = set(), None
        self._opt_called = True  # the LR scheduler's check that the optimizer stepped before it
        return norm

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group dicts and state: the parts take them
        self._share()
