"""AdamW with decoupled weight decay (not on biases and norms) and the LR schedule."""

from __future__ import annotations

import functools
import logging
import math

import torch

from ..config.schema import BNB_OPTIMS, TrainConfig, optim_state
from ..errors import TunesmithError

log = logging.getLogger("tunesmith")


def build_optimizer(model, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, or LLaMA-Factory's use_muon (engines/muon.py) / use_adam_mini / use_galore and use_apollo
    (engines/low_rank.py) / use_badam (engines/badam.py)."""
    if cfg.use_muon:
        return _muon(model, cfg, device)
    if cfg.use_adam_mini:
        return _adam_mini(model, cfg)
    if cfg.use_galore or cfg.use_apollo:
        from .low_rank import build_low_rank

        return build_low_rank(model, cfg, decays)
    if cfg.use_badam:
        from .badam import BlockAdamW

        return BlockAdamW(model, cfg, decays, fused=device.type == "cuda")
    if cfg.optim in BNB_OPTIMS:
        return _bitsandbytes_adamw(model, cfg)
    return torch.optim.AdamW(parameter_groups(model, cfg), **adamw_options(cfg), fused=device.type == "cuda")


def _bitsandbytes_adamw(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW for optim: adamw_8bit / adamw_bnb_8bit (8-bit moments), paged_adamw_8bit and
    paged_adamw_32bit (moments in paged memory), over parameter_groups. As transformers' Trainer does, the
    embeddings keep 32-bit moments under the 8-bit ones (8-bit states of embedding rows are unstable)."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise TunesmithError(f"optim: {cfg.optim} needs bitsandbytes: pip install 'tunesmith[qlora]'") from None
    kind = {"adamw_8bit": bnb.optim.AdamW8bit, "adamw_bnb_8bit": bnb.optim.AdamW8bit,
            "paged_adamw_8bit": bnb.optim.PagedAdamW8bit, "paged_adamw_32bit": bnb.optim.PagedAdamW32bit}[cfg.optim]
    optimizer = kind(parameter_groups(model, cfg), **adamw_options(cfg))
    if optim_state(cfg.optim) == "bnb8":  # its own override manager: the global one keeps every run's models
        manager = object.__new__(bnb.optim.GlobalOptimManager)
        manager.initialize()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.weight.requires_grad:
                manager.override_config(module.weight, "optim_bits", 32)
        optimizer.mng = manager
    log.info("optim: %s (bitsandbytes %s)", cfg.optim, kind.__name__)
    return optimizer


def _muon(model, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """The trainable parameters split between Muon and AdamW (engines/muon.py), each part in groups with and
    without weight decay as parameter_groups makes them."""
    from .muon import MuonWithAdamW, takes_muon

    split: dict[tuple[bool, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            split.setdefault((takes_muon(name, param), decays(name, param)), []).append(param)

    def groups(muon: bool) -> list[dict]:
        return [{"params": split[muon, decay], "weight_decay": cfg.weight_decay if decay else 0.0}
                for decay in (True, False) if (muon, decay) in split]

    muon_groups, adamw_groups = groups(True), groups(False)
    if not muon_groups:
        raise TunesmithError("use_muon: this model has no trainable weight matrices for Muon (it takes the 2-D "
                             "weights of the hidden layers); remove use_muon")
    log.info("Muon for %d weight matrices, AdamW for %d other parameters",
             sum(len(g["params"]) for g in muon_groups), sum(len(g["params"]) for g in adamw_groups))
    return MuonWithAdamW(muon_groups, adamw_groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                         eps=cfg.adam_epsilon, fused=device.type == "cuda")


def _adam_mini(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam-mini (the adam-mini package, as LLaMA-Factory builds it): one second-moment value per attention head
    of q and k, per output neuron of the other matrices and per token of the embeddings, so its state is about
    half of AdamW's. It partitions by the model's hidden size and head counts and by parameter names."""
    try:
        from adam_mini import Adam_mini
    except ImportError:
        raise TunesmithError("use_adam_mini needs the adam-mini package: pip install 'tunesmith[adam-mini]'") from None
    text = model.config.get_text_config()
    optimizer = Adam_mini(named_parameters=[(n, p) for n, p in model.named_parameters() if p.requires_grad],
                          lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                          weight_decay=cfg.weight_decay, dim=text.hidden_size, n_heads=text.num_attention_heads,
                          n_kv_heads=getattr(text, "num_key_value_heads", None), verbose=False)
    optimizer.world_size = 1  # it counts the machine's GPUs as processes; tunesmith runs it in one
    log.info("Adam-mini over %d parameters", len(optimizer.param_groups))
    return optimizer


def parameter_groups(model, cfg: TrainConfig) -> list[dict]:
    """The trainable parameters in groups: with weight decay, and without (biases and norms); with LoRA+
    (loraplus_lr_ratio), each of those again for the lora_B matrices and the 1-D parameters (learning_rate x the
    ratio, as LLaMA-Factory groups them), then an embedding's lora_embedding_B (loraplus_lr_embedding)."""
    buckets: dict[tuple[str, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            part = _loraplus_part(name, param) if cfg.loraplus_lr_ratio else ""
            buckets.setdefault((part, decays(name, param)), []).append(param)
    rates = {"A": cfg.learning_rate, "B": cfg.learning_rate * (cfg.loraplus_lr_ratio or 1.0),
             "embedding": cfg.loraplus_lr_embedding}
    groups = []
    for part in ("", "A", "B", "embedding"):
        for decay in (True, False):
            if (part, decay) in buckets:
                groups.append({"params": buckets[part, decay], "weight_decay": cfg.weight_decay if decay else 0.0,
                               **({"lr": rates[part]} if part else {})})
    return groups


def decays(name: str, param) -> bool:
    """Whether weight decay applies: not to biases and norms."""
    return param.ndim >= 2 and "norm" not in name.lower()


def _loraplus_part(name: str, param) -> str:
    if "lora_embedding_B" in name:
        return "embedding"
    return "B" if "lora_B" in name or param.ndim == 1 else "A"


def adamw_options(cfg: TrainConfig) -> dict:
    return {"lr": cfg.learning_rate, "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon}


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    return cfg.warmup_steps if cfg.warmup_steps > 0 else math.ceil(cfg.warmup_ratio * total_steps)


def _schedule_factor(step: int, *, kind: str, warmup: int, total: int) -> float:
    """transformers' schedules (same formulas, so a resumed Hugging Face run continues on the same curve), written
    here because importing transformers.optimization imports peft (seconds of start-up)."""
    if step < warmup and kind != "constant":
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    if kind == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return 1.0  # constant, constant_with_warmup after the warm-up


def build_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    factor = functools.partial(_schedule_factor, kind=cfg.lr_scheduler_type, warmup=warmup_steps(cfg, total_steps),
                               total=total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def realign_schedule(optimizer, scheduler) -> None:
    """After loading a checkpoint's optimizer and schedule into a schedule built for a new total (a resumed
    run that extends max_steps / epochs), set each group's learning rate to the new schedule's value at the
    resumed step; the loaded optimizer state still holds the old schedule's."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        return
    values = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, lambdas)]
    for group, value in zip(optimizer.param_groups, values):
        group["lr"] = value
    scheduler._last_lr = values


def load_schedule(optimizer, scheduler, state: dict) -> None:
    """A checkpoint's schedule (its step) into this run's, keeping this run's base learning rates: a resume that
    changes learning_rate (resume_allow_changes) goes on with the new rate on the same curve."""
    base_lrs = list(scheduler.base_lrs)
    scheduler.load_state_dict(state)
    keep_base_lrs(optimizer, scheduler, base_lrs)


def keep_base_lrs(optimizer, scheduler, base_lrs: list[float]) -> None:
    """Put back the base learning rates a loaded schedule replaced, and the groups' rates at its step."""
    scheduler.base_lrs = list(base_lrs)
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["initial_lr"] = base
    realign_schedule(optimizer, scheduler)


def take_back_schedule_step(optimizer, scheduler) -> None:
    """Undo one scheduler.step(): the update it followed was skipped (found non-finite on the device), and the
    schedule counts applied updates. (Our schedules are LambdaLRs; another kind is left to move on.)"""
    if getattr(scheduler, "lr_lambdas", None) is None:
        return
    scheduler.last_epoch -= 1
    realign_schedule(optimizer, scheduler)
