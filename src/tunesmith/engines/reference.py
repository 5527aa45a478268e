"""The reference policy of DPO/KTO/online-RL KL terms, as engines run it.

adapters_off: the policy itself with its LoRA adapters disabled (no extra memory).
copy: a frozen copy of the starting model, made when the engine is built.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ..errors import TunesmithError


class ReferenceView:
    def __init__(self, model: torch.nn.Module, mode: str):
        self.mode = mode  # copy | adapters_off | precomputed | none (resolved by config.resolve)
        self.frozen = None
        if mode == "copy":
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            self.frozen = copy.deepcopy(base).eval().requires_grad_(False)

    @contextlib.contextmanager
    def module(self, policy: torch.nn.Module):
        """The module to run for reference outputs."""
        if self.mode == "adapters_off":
            with policy.disable_adapter():
                yield policy
        elif self.mode == "copy":
            yield self.frozen
        else:
            raise TunesmithError(f"this run has no reference model (pref_reference: {self.mode})")
