"""GaLore and APOLLO (LLaMA-Factory's use_galore / use_apollo): AdamW whose moments live in a low-rank projection
of each target weight's gradient (the galore-torch and apollo-torch packages, as LLaMA-Factory builds them).

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
    log.info("%s: %d weight matrices projected (%s), %d other parameters", "GaLore" if kind == "galore" else "APOLLO",
             len(projected), ", ".join(f"{k} {v}" for k, v in settings.items()),
             len(plain[True]) + len(plain[False]))
    # apollo-torch reads scale_front from the optimizer, not a group (LLaMA-Factory sets it in the group)
    extra = {"no_deprecation_warning": True} if kind == "galore" else {"scale_front": cfg.apollo_scale_front}
    return _optimizer_class(kind)(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  eps=cfg.adam_epsilon, **extra)
