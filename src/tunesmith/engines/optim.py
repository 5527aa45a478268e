"""AdamW with decoupled weight decay (not on biases and norms) and the LR schedule."""

from __future__ import annotations

import math

import torch

from ..config.schema import TrainConfig


def build_optimizer(model, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        fused=device.type == "cuda",
    )


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    return cfg.warmup_steps if cfg.warmup_steps > 0 else math.ceil(cfg.warmup_ratio * total_steps)


def build_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    from transformers import get_scheduler

    return get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup_steps(cfg, total_steps),
        num_training_steps=total_steps,
    )
