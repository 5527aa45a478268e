"""One device: plain PyTorch with autocast for mixed precision."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable

import torch

from ..errors import TunesmithError
from .base import StepResult


class NonFiniteError(TunesmithError):
    """A non-finite loss or gradient; the loop names the step."""


class SingleEngine:
    def __init__(self, model, optimizer, scheduler, device: torch.device, *, precision: str, max_grad_norm: float,
                 skip_nonfinite: bool):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.precision = precision  # fp32 | bf16 (autocast) | fp16 (autocast + scaler) | pure_bf16
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        # Sharded engines average gradients over ranks; they set this to the world size so the
        # average is the sum that the step's global normaliser expects.
        self.loss_scale = 1
        self._nonfinite_loss = False

    def _autocast(self):
        if self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def forward_backward(self, batch, loss_fn: Callable):
        self.model.train()
        batch = batch.to(self.device)
        with self._autocast():
            out = loss_fn(self.model, batch)
        if not torch.isfinite(out.loss.detach()):
            self._nonfinite_loss = True
        loss = out.loss * self.loss_scale if self.loss_scale != 1 else out.loss
        loss = self.scaler.scale(loss) if self.scaler else loss
        loss.backward()
        return out

    @torch.no_grad()
    def evaluate(self, batch, loss_fn: Callable):
        self.model.eval()
        with self._autocast():
            return loss_fn(self.model, batch.to(self.device))

    def step(self) -> StepResult:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = self.scheduler.get_last_lr()[0]
        bad = self._nonfinite_loss or not math.isfinite(grad_norm)
        self._nonfinite_loss = False
        if bad and self.scaler is None:
            self.optimizer.zero_grad(set_to_none=True)
            if not self.skip_nonfinite:
                raise NonFiniteError(f"non-finite loss or gradient (grad norm {grad_norm})")
            return StepResult(grad_norm, True, lr)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skips the update itself on inf/nan
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(grad_norm, False, lr)

    def save(self, path: Path) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        torch.save(state, Path(path) / "engine_state.pt")

    def load(self, path: Path) -> None:
        state = torch.load(Path(path) / "engine_state.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def export_hf(self, path: Path, tokenizer) -> None:
        self.model.save_pretrained(str(path), safe_serialization=True)
        tokenizer.save_pretrained(str(path))

    def full_state_for_rollout(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()}
