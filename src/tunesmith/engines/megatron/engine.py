"""The Megatron-Core engine: the model as megatron-core modules (GPTModel, local layer spec), trained by the
Runner through the Engine interface, saved as Hugging Face checkpoints.

The engine is built in a fixed order (build_megatron_engine):
  1. the Hugging Face model (make_model, on the CPU): its config, weights and rotary frequencies;
  2. checks: the family has a weight map, the degrees fit the world size and the model;
  3. megatron-core's parallel groups and RNG streams;
  4. the GPTModel, the Hugging Face weights mapped into it (weights/), moved to the device;
  5. the optimizer and LR schedule (the same AdamW and schedule as the other engines).
Precision: fp32 weights with bf16 autocast (bf16: true), as the single engine, so that the two
give the same losses; pure_bf16 keeps the weights in bf16. The Hugging Face model stays on the CPU
as the template every save writes through (export_hf): checkpoints are plain transformers folders.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ... import dist
from ...errors import TunesmithError
from ...models.weights import load_model_weights
from ..base import (LossFn, StepOutput, StepResult, eval_mode, load_matching_optimizer, read_torch_file, schedule_at,
                    switched_to_reference, write_torch_file)
from ..local_step import autocast, step_of
from ..optim import realign_schedule
from .forward import run_megatron_forward
from .schedule import run_forward_backward
from .weights import family_map

log = logging.getLogger("tunesmith")


def megatron_state(model) -> dict:
    """The model's weights by megatron-core name (no Transformer Engine extra state)."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def load_hf_state(model, hf_state: dict, hf_config) -> None:
    """Hugging Face weights (full, by HF name) into the GPTModel; every megatron weight must be filled."""
    mapped = family_map(hf_config).to_megatron(hf_state, hf_config)
    ours = megatron_state(model)
    missing = sorted(set(ours) - set(mapped))
    unexpected = sorted(set(mapped) - set(ours))
    if missing or unexpected:
        raise TunesmithError(f"the {hf_config.model_type} weight map does not fit the megatron-core model: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, tensor in mapped.items():
            if tuple(ours[name].shape) != tuple(tensor.shape):
                raise TunesmithError(f"{name}: the checkpoint gives {tuple(tensor.shape)}, the megatron-core model "
                                     f"has {tuple(ours[name].shape)}")
            ours[name].copy_(tensor)


def hf_state_of(model, hf_config) -> dict:
    """The GPTModel's weights by Hugging Face name, on the CPU."""
    state = {k: v.detach().cpu() for k, v in megatron_state(model).items()}
    return family_map(hf_config).to_hf(state, hf_config)


class MegatronEngine:
    def __init__(self, model, hf_model, optimizer, scheduler, device: torch.device, *, angles, precision: str,
                 max_grad_norm: float, skip_nonfinite: bool, reference=None):
        self.model = model
        self.hf_model = hf_model  # CPU template for export_hf and load
        self.optimizer, self.scheduler = optimizer, scheduler
        self.device, self.angles, self.precision = device, angles, precision
        self.max_grad_norm, self.skip_nonfinite = max_grad_norm, skip_nonfinite
        self.scaler = None  # fp16 is refused at config time
        # pref_reference copy: a second GPTModel with the starting weights, frozen (megatron-core modules hold
        # process groups, which copy.deepcopy cannot copy); precomputed / none: no model
        self.reference_model = reference
        self._on_reference = False
        self._nonfinite_loss = False

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        return run_forward_backward(self, micro_batches, loss_fn)

    def _forward_module(self):
        if not self._on_reference:
            return self.model
        if self.reference_model is None:
            raise TunesmithError("this run has no reference model on backend: megatron (pref_reference: copy builds "
                                 "one; precomputed and none need none)")
        return self.reference_model

    @torch.no_grad()
    def forward(self, micro_batches: list, fn: LossFn) -> list:
        module = self._forward_module()
        results = []
        with eval_mode(self.model):
            for batch in micro_batches:
                batch = batch.to(self.device)
                with autocast(self.precision, self.device):
                    results.append(fn.fn(run_megatron_forward(module, batch, fn.outputs, self.angles), batch))
        return results

    def reference(self):
        return switched_to_reference(self)

    def step(self) -> StepResult:
        return step_of(self)

    def save(self, path: Path) -> None:
        write_torch_file({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                         Path(path) / "engine_state.pt")

    def _load_hf_weights(self, path: Path) -> None:
        load_model_weights(self.hf_model, Path(path))
        load_hf_state(self.model, self.hf_model.state_dict(), self.hf_model.config)

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """Weights from the checkpoint's Hugging Face export, optimizer and schedule from engine_state.pt
        (weights_only)."""
        self._load_hf_weights(path)
        state = read_torch_file(Path(path) / "engine_state.pt", map_location=self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        realign_schedule(self.optimizer, self.scheduler)

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        self._load_hf_weights(path)
        if optimizer_state is not None:
            log.warning("Megatron: %s holds another parameter layout (fused QKV and gate/up here); the optimizer "
                        "starts fresh", Path(path) / "optimizer.pt")
        schedule_at(self.optimizer, self.scheduler, step)

    def export_hf(self, path: Path, saver) -> None:
        """The trained weights back under their Hugging Face names, written by transformers itself."""
        if dist.is_main():
            self.hf_model.load_state_dict(hf_state_of(self.model, self.hf_model.config), strict=True)
            self.hf_model.save_pretrained(str(path), safe_serialization=True)
            saver.save_pretrained(str(path))

    def full_state_for_rollout(self) -> dict:
        return hf_state_of(self.model, self.hf_model.config)
