"""One device: plain PyTorch with autocast for mixed precision."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.safetensors_write import save_weights
from ..models.weights import load_model_weights
from .base import (LossFn, StepOutput, StepResult, from_bitsandbytes, load_matching_optimizer, load_own_optimizer,
                   read_torch_file, schedule_at, switched_to_reference, write_torch_file)
from .optim import load_schedule
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
        write_torch_file(state, Path(path) / "engine_state.pt")

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """Weights from the checkpoint's Hugging Face export (safetensors), optimizer and schedule from
        engine_state.pt (weights_only: tensors and numbers, never code, whether trusted or not)."""
        load_model_weights(self.model, Path(path))
        # bitsandbytes copies the state it loads onto the parameters' device: read on the CPU, not twice on the GPU
        on = "cpu" if from_bitsandbytes(self.optimizer) else self.device
        state = read_torch_file(Path(path) / "engine_state.pt", map_location=on)
        load_own_optimizer(self.optimizer, state["optimizer"], path)
        load_schedule(self.optimizer, self.scheduler, state["scheduler"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        load_model_weights(self.model, Path(path))
        if hasattr(self.optimizer, "weights_loaded"):  # BAdam's fp32 copies of the loaded weights
            self.optimizer.weights_loaded()
        if optimizer_state is not None:
            load_matching_optimizer(self.optimizer, optimizer_state, Path(path) / "optimizer.pt")
        schedule_at(self.optimizer, self.scheduler, step)

    def export_hf(self, path: Path, saver) -> None:
        save_weights(self.model, path)
        saver.save_pretrained(str(path))

    def full_state_for_rollout(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()}
