"""One device: plain PyTorch with autocast for mixed precision."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.weights import load_model_weights
from .base import LossFn, StepOutput, StepResult, switched_to_reference
from .optim import realign_schedule
from .local_step import backward_each, forward_each, step_of
from .reference import ReferenceView


class SingleEngine:
    def __init__(self, model, optimizer, scheduler, device: torch.device, *, precision: str, max_grad_norm: float,
                 skip_nonfinite: bool, reference_mode: str = "none"):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.precision = precision  # fp32 | bf16 (autocast) | fp16 (autocast + scaler) | pure_bf16
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.ref = ReferenceView(model, reference_mode)
        self._on_reference = False
        self._nonfinite_loss = False

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        return backward_each(self, micro_batches, loss_fn)

    def forward(self, micro_batches: list, fn: LossFn) -> list:
        return forward_each(self, micro_batches, fn)

    def reference(self):
        return switched_to_reference(self)

    def step(self) -> StepResult:
        return step_of(self)

    def save(self, path: Path) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        torch.save(state, Path(path) / "engine_state.pt")

    def load(self, path: Path) -> None:
        load_model_weights(self.model, Path(path))  # the checkpoint's Hugging Face export
        state = torch.load(Path(path) / "engine_state.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        realign_schedule(self.optimizer, self.scheduler)
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def export_hf(self, path: Path, saver) -> None:
        self.model.save_pretrained(str(path), safe_serialization=True)
        saver.save_pretrained(str(path))

    def full_state_for_rollout(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()}
