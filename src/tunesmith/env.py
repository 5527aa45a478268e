"""`tunesmith env`: versions, devices and which optional features are usable."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform

OPTIONAL = {
    "liger-kernel": ("liger_kernel", "enable_liger_kernel"),
    "flash-attn": ("flash_attn", "flash_attn: fa2"),
    "tensorboard": ("tensorboard", "report_to: tensorboard"),
    "wandb": ("wandb", "report_to: wandb"),
    "swanlab": ("swanlab", "report_to: swanlab"),
    "deepspeed": ("deepspeed", "DeepSpeed engine (not available yet)"),
    "megatron-core": ("megatron.core", "Megatron-Core engine (not available yet)"),
    "av": ("av", "video/audio decoding (vision/audio-language models)"),
}

CORE = ["tunesmith", "torch", "transformers", "tokenizers", "peft", "datasets", "accelerate", "safetensors", "pydantic"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def collect() -> dict:
    import torch

    info = {"python": platform.python_version(), "platform": platform.platform()}
    info.update({name: _version(name) or "missing" for name in CORE})
    info["cuda"] = torch.version.cuda or "none"
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    info["gpus"] = ", ".join(gpus) if gpus else "none (training runs on the CPU)"
    info["bf16 on GPU"] = str(bool(gpus) and torch.cuda.is_bf16_supported())
    for dist, (module, feature) in OPTIONAL.items():
        ok = _importable(module)
        info[f"{dist}"] = f"{_version(dist) or 'installed'} -> {feature}" if ok else f"not installed ({feature} unusable)"
    return info
