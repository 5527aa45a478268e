"""Which parameters train: full, freeze (last N layers / named modules) or LoRA (PEFT)."""

from __future__ import annotations

import logging
import re

from ..config.schema import FinetuneConfig
from ..errors import ConfigError

log = logging.getLogger("tunesmith")

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def apply_finetuning(model, cfg: FinetuneConfig, adapter_path: str | None = None):
    """Return the model ready to train (a PeftModel for LoRA)."""
    if cfg.finetuning_type == "full":
        model.requires_grad_(True)
        return model
    if cfg.finetuning_type == "freeze":
        return _apply_freeze(model, cfg)
    return _apply_lora(model, cfg, adapter_path)


def _num_layers(model) -> int:
    layers = {int(m.group(1)) for name, _ in model.named_parameters() if (m := _LAYER.search(name))}
    if not layers:
        raise ConfigError(["finetuning_type: freeze found no '.layers.N.' blocks in this model; use lora or full"])
    return max(layers) + 1


def _apply_freeze(model, cfg: FinetuneConfig):
    n = _num_layers(model)
    k = cfg.freeze_trainable_layers
    if k == 0 or abs(k) > n:
        raise ConfigError([f"freeze_trainable_layers: {k} must be between -{n} and {n} (not 0) for this {n}-layer model"])
    trainable_layers = set(range(n - k, n)) if k > 0 else set(range(-k))
    modules = cfg.freeze_trainable_modules
    matched_extra: set[str] = set()
    for name, param in model.named_parameters():
        m = _LAYER.search(name)
        in_layer = m is not None and int(m.group(1)) in trainable_layers
        module_ok = "all" in modules or any(f".{mod}." in name for mod in modules)
        extra = [e for e in cfg.freeze_extra_modules if e in name.split(".")]
        matched_extra.update(extra)
        param.requires_grad_(bool((in_layer and module_ok) or extra))
    missing = sorted(set(cfg.freeze_extra_modules) - matched_extra)
    if missing:
        raise ConfigError([f"freeze_extra_modules: {missing} match no module of this model"])
    return model


def _apply_lora(model, cfg: FinetuneConfig, adapter_path: str | None):
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_path:
        return PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    targets = "all-linear" if "all" in cfg.lora_target else cfg.lora_target
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        modules_to_save=cfg.additional_target or None,
        use_dora=cfg.use_dora,
        use_rslora=cfg.use_rslora,
    )
    try:
        peft_model = get_peft_model(model, lora)
    except ValueError as err:
        raise ConfigError([f"lora_target {cfg.lora_target}: {err}"]) from None
    if getattr(model, "is_activation_checkpointing", False):
        peft_model.enable_input_require_grads()
    return peft_model


def trainable_report(model) -> str:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"trainable params: {trainable:,} / {total:,} ({100 * trainable / max(total, 1):.2f}%)"
