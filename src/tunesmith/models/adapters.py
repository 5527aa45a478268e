"""Which parameters train: full, freeze (last N layers / named modules) or LoRA (PEFT)."""

from __future__ import annotations

import logging
import re

import torch

from ..config.schema import ADAPTER_TYPES, FinetuneConfig
from ..errors import ConfigError
from .families import family_of, module_groups

log = logging.getLogger("tunesmith")

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def apply_finetuning(model, cfg: FinetuneConfig, adapter_path: str | None = None):
    """Return the model ready to train (a PeftModel for LoRA and OFT).

    Vision/audio-language models: the parts named by freeze_vision_tower (also the audio
    encoder), freeze_multi_modal_projector and freeze_language_model stay frozen in every
    finetuning type, and never get LoRA adapters.
    """
    frozen = frozen_parameters(model, cfg)
    if cfg.finetuning_type in ADAPTER_TYPES:
        return _apply_adapters(model, cfg, adapter_path, frozen)
    if cfg.finetuning_type == "full":
        model.requires_grad_(True)
    else:
        _apply_freeze(model, cfg)
        _unfreeze_media_parts(model, cfg)
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        blocks = sorted({n.split(".")[-2] for n, _ in model.named_parameters() if _LAYER.search(n)})
        raise ConfigError([f"no parameter trains with finetuning_type: {cfg.finetuning_type} and these settings; "
                           f"freeze_trainable_modules takes module names inside the layers, e.g. {blocks[:8]}, "
                           "or all"])
    return model


def frozen_parameters(model, cfg: FinetuneConfig) -> set[str]:
    family = family_of(model.config)
    if family is None:
        if cfg.freeze_language_model:
            raise ConfigError(["freeze_language_model: true needs a vision/audio-language model"])
        return set()
    groups = module_groups(model, family)
    wanted = {
        "vision_tower": cfg.freeze_vision_tower,
        "audio_tower": cfg.freeze_vision_tower,
        "projector": cfg.freeze_multi_modal_projector,
        "language_model": cfg.freeze_language_model,
    }
    return {name for group, frozen in wanted.items() if frozen for name in groups.get(group, [])}


def _unfreeze_media_parts(model, cfg: FinetuneConfig) -> None:
    """freeze fine-tuning picks language-model layers; media parts train when their freeze_* flag is off."""
    family = family_of(model.config)
    if family is None:
        return
    groups = module_groups(model, family)
    trainable = set()
    if not cfg.freeze_vision_tower:
        trainable |= set(groups.get("vision_tower", [])) | set(groups.get("audio_tower", []))
    if not cfg.freeze_multi_modal_projector:
        trainable |= set(groups.get("projector", []))
    for name, param in model.named_parameters():
        if name in trainable:
            param.requires_grad_(True)


def _language_model_params(model) -> set[str] | None:
    """Parameter names of the language model of a vision/audio-language model (None for a text model):
    freeze picks its layers there, never in the vision or audio encoder's own `.layers.N.`."""
    family = family_of(model.config)
    return None if family is None else set(module_groups(model, family).get("language_model", []))


def _num_layers(model, allowed: set[str] | None) -> int:
    layers = {int(m.group(1)) for name, _ in model.named_parameters()
              if (allowed is None or name in allowed) and (m := _LAYER.search(name))}
    if not layers:
        raise ConfigError(["finetuning_type: freeze found no '.layers.N.' blocks in this model; use lora or full"])
    return max(layers) + 1


def expanded_layers(n: int, k: int) -> list[int]:
    """The blocks a LLaMA Pro expansion of k blocks added to a model that now has n layers: after each group of
    n / k layers, the last layer of the group (LLaMA-Factory's llama_pro.py and use_llama_pro)."""
    if k <= 0 or n % k:
        raise ConfigError([f"use_llama_pro: the model's {n} layers must be a multiple of freeze_trainable_layers "
                           f"({k}), the number of blocks the expansion added; set freeze_trainable_layers to it"])
    stride = n // k
    return list(range(stride - 1, n, stride))


def _apply_freeze(model, cfg: FinetuneConfig):
    allowed = _language_model_params(model)
    n = _num_layers(model, allowed)
    k = cfg.freeze_trainable_layers
    if cfg.use_llama_pro:
        layers = expanded_layers(n, k)
        log.info("use_llama_pro: training the expanded blocks %s of %d layers", layers, n)
        _train_layers(model, cfg, allowed, set(layers))
        return
    if k == 0:
        raise ConfigError([f"freeze_trainable_layers: 0 trains no layer; give the number of last layers to train "
                           f"(or -N for the first N) of this {n}-layer model"])
    if abs(k) > n:  # as LLaMA-Factory: more layers than the model has means all of them
        log.warning("freeze_trainable_layers: %d is more than this model's %d layers: all %d are trained", k, n, n)
        k = n if k > 0 else -n
    _train_layers(model, cfg, allowed, set(range(n - k, n)) if k > 0 else set(range(-k)))


def _train_layers(model, cfg: FinetuneConfig, allowed: set[str] | None, trainable_layers: set[int]) -> None:
    """Only those language-model layers (their freeze_trainable_modules) and freeze_extra_modules train."""
    modules = cfg.freeze_trainable_modules
    matched_extra: set[str] = set()
    for name, param in model.named_parameters():
        m = _LAYER.search(name) if allowed is None or name in allowed else None
        in_layer = m is not None and int(m.group(1)) in trainable_layers
        module_ok = "all" in modules or any(f".{mod}." in name for mod in modules)
        extra = [e for e in cfg.freeze_extra_modules if e in name.split(".")]
        matched_extra.update(extra)
        param.requires_grad_(bool((in_layer and module_ok) or extra))
    missing = sorted(set(cfg.freeze_extra_modules) - matched_extra)
    if missing:
        raise ConfigError([f"freeze_extra_modules: {missing} match no module of this model"])


def _lora_targets(model, cfg: FinetuneConfig, frozen: set[str]):
    """'all' = every linear layer outside the frozen parts (and outside the output head); with use_llama_pro, only
    those of the expanded blocks."""
    if cfg.use_llama_pro:
        return _expanded_targets(model, cfg, frozen)
    if "all" not in cfg.lora_target:
        return cfg.lora_target
    if not frozen and family_of(model.config) is None:
        return "all-linear"
    output = model.get_output_embeddings()
    names = [name for name, module in model.named_modules()
             if _plain_linear(module) and module is not output and f"{name}.weight" not in frozen]
    if not names:
        raise ConfigError(["lora_target: all found no linear layer outside the frozen parts; unfreeze one"])
    _check_towers_adapted(model, names, frozen)
    return names


def _expanded_targets(model, cfg: FinetuneConfig, frozen: set[str]) -> list[str]:
    allowed = _language_model_params(model)
    layers = set(expanded_layers(_num_layers(model, allowed), cfg.freeze_trainable_layers))
    wanted = None if "all" in cfg.lora_target else cfg.lora_target
    names = [name for name, module in model.named_modules()
             if _plain_linear(module) and f"{name}.weight" not in frozen
             and (allowed is None or f"{name}.weight" in allowed) and (m := _LAYER.search(f"{name}.weight"))
             and int(m.group(1)) in layers and (wanted is None or name.split(".")[-1] in wanted)]
    if not names:
        raise ConfigError([f"use_llama_pro: lora_target {cfg.lora_target} matches no linear layer of the expanded "
                           f"blocks {sorted(layers)}"])
    log.info("use_llama_pro: LoRA on the expanded blocks %s", sorted(layers))
    return names


def _check_towers_adapted(model, targets: list[str], frozen: set[str]) -> None:
    """An unfrozen media tower must get adapters, or it would stay frozen without a word: Gemma 3n's image encoder
    is convolutions (timm MobileNetV5), which LoRA's linear targets do not reach."""
    family = family_of(model.config)
    groups = module_groups(model, family) if family is not None else {}
    for group in ("vision_tower", "audio_tower"):
        names = groups.get(group, [])
        if names and not frozen & set(names) and not any(n.startswith(f"{t}.") for t in targets for n in names):
            raise ConfigError([f"freeze_vision_tower: false with finetuning_type: lora, but this model's {group} has no "
                               f"linear layer LoRA adapts ({family.name}'s is convolutions); keep freeze_vision_tower: "
                               "true, or train it with finetuning_type: full"])


def _plain_linear(module) -> bool:
    """A linear layer PEFT can wrap: a Linear subclass with a forward of its own (Llama 4's router returns scores
    and logits) is left out, as its output is not the layer's product; bitsandbytes' quantized linears (QLoRA)
    are in."""
    if not isinstance(module, torch.nn.Linear):
        return False
    return type(module).forward is torch.nn.Linear.forward or type(module).__module__.startswith("bitsandbytes.")


def _apply_adapters(model, cfg: FinetuneConfig, adapter_path: str | None, frozen: set[str]):
    from peft import get_peft_model

    from . import pissa

    if adapter_path:
        return pissa.load_adapter_model(model, adapter_path, is_trainable=True)
    reward_model = getattr(model, "score", None) is not None and model.get_output_embeddings() is None
    common = dict(task_type="SEQ_CLS" if reward_model else "CAUSAL_LM", target_modules=_lora_targets(model, cfg, frozen),
                  modules_to_save=cfg.additional_target or None)
    try:
        with pissa.seeded(cfg.pissa_init):
            peft_model = get_peft_model(model, _lora_config(cfg, common) if cfg.finetuning_type == "lora"
                                        else _oft_config(cfg, common))
    except ValueError as err:
        raise ConfigError([f"finetuning_type {cfg.finetuning_type}, lora_target {cfg.lora_target}: {err}"]) from None
    if getattr(model, "is_activation_checkpointing", False):
        peft_model.enable_input_require_grads()
    return peft_model


def _lora_config(cfg: FinetuneConfig, common: dict):
    from peft import LoraConfig

    from .pissa import init_lora_weights

    init = init_lora_weights(cfg.pissa_iter) if cfg.pissa_init else True
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank, lora_dropout=cfg.lora_dropout,
                      use_dora=cfg.use_dora, use_rslora=cfg.use_rslora, init_lora_weights=init, **common)


def _oft_config(cfg: FinetuneConfig, common: dict):
    """PEFT's OFT as LLaMA-Factory configures it: oft_rank blocks or blocks of oft_block_size (PEFT takes one of
    the two: a rank given alone drops the default block size)."""
    from peft import OFTConfig

    block_size = cfg.oft_block_size if not cfg.oft_rank or "oft_block_size" in cfg.model_fields_set else 0
    return OFTConfig(r=cfg.oft_rank, oft_block_size=block_size, module_dropout=cfg.module_dropout, **common)


def trainable_report(model) -> str:
    """Trainable / total parameters, per part for vision/audio-language models."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    line = f"trainable params: {trainable:,} / {total:,} ({100 * trainable / max(total, 1):.2f}%)"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = family_of(base.config)
    if family is None:
        return line
    params = dict(model.named_parameters())
    parts = []
    for group, names in module_groups(model, family).items():
        if not names:
            continue
        n_train = sum(params[n].numel() for n in names if params[n].requires_grad)
        n_all = sum(params[n].numel() for n in names)
        parts.append(f"{group} {n_train:,}/{n_all:,}")
    return line + "; " + ", ".join(parts)
