"""`tunesmith env`: versions, devices and which optional features are usable."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from typing import NamedTuple


class Extra(NamedTuple):
    module: str | None  # what is imported; None: installed means the distribution is (its module path is shared)
    feature: str  # what it enables in tunesmith
    install: str  # how to get it


# One line per optional package: the feature it enables and how to install it. Say only what exists.
OPTIONAL: dict[str, Extra] = {
    "deepspeed": Extra("deepspeed", "backend: deepspeed (ZeRO stages 0-3, CPU offload)",
                           "pip install 'tunesmith[deepspeed]'"),
    "liger-kernel": Extra("liger_kernel", "enable_liger_kernel: true (fused RMSNorm, SwiGLU, RoPE, linear + CE)",
                              "pip install 'tunesmith[liger]'"),
    "flash-attn": Extra("flash_attn_2_cuda", "flash_attn: fa2 (auto picks it on a GPU)",
                            "pip install flash-attn --no-build-isolation"),
    "flash-attn-4": Extra(None, "flash_impl: auto | fa4 (the varlen attention runs FlashAttention 4 on Hopper and "
                          "Blackwell GPUs)", "pip install flash-attn-4"),
    "vllm": Extra("vllm", "infer_backend: vllm for `tunesmith serve` and `chat`; rollout_backend: vllm for "
                      "online RL on a CUDA GPU", "pip install 'tunesmith[vllm]'"),
    "tensorboard": Extra("tensorboard", "report_to: tensorboard", "pip install tensorboard"),
    "wandb": Extra("wandb", "report_to: wandb", "pip install 'tunesmith[wandb]'"),
    "swanlab": Extra("swanlab", "report_to: swanlab", "pip install 'tunesmith[swanlab]'"),
    "math-verify": Extra("math_verify", "math-verify answer matching in the accuracy reward",
                             "pip install 'tunesmith[math]'"),
    "av": Extra("av", "video/audio decoding (vision/audio-language models)", "pip install av"),
    "megatron-core": Extra("megatron.core", "backend: megatron / USE_MCA=1 (Megatron-Core engine, TP/PP/CP/EP/DP, "
                           "local layer spec; tested with megatron-core " + "0.19.2)",
                           "pip install 'tunesmith[megatron]'"),
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
    except (ImportError, ValueError):  # a missing parent package, or a broken one
        return False


def _installed(dist: str, spec: Extra) -> bool:
    return _version(dist) is not None if spec.module is None else _importable(spec.module)


def optional_line(spec: Extra, installed: bool, version: str | None) -> str:
    """'0.16.4 -> backend: deepspeed (...)', or 'not installed (pip install ...) -> needed for backend: ...'."""
    if installed:
        return f"{version or 'installed'} -> {spec.feature}"
    if spec.feature.startswith(("not used", "nothing")):
        return f"not installed ({spec.install}); {spec.feature}"
    return f"not installed ({spec.install}) -> needed for {spec.feature}"


def collect() -> dict:
    import torch

    info = {"python": platform.python_version(), "platform": platform.platform()}
    info.update({name: _version(name) or "missing" for name in CORE})
    info["cuda"] = torch.version.cuda or "none"
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    info["gpus"] = ", ".join(gpus) if gpus else "none (training runs on the CPU)"
    info["bf16 on GPU"] = str(bool(gpus) and torch.cuda.is_bf16_supported())
    for dist, spec in OPTIONAL.items():
        info[dist] = optional_line(spec, _installed(dist, spec), _version(dist))
    info["rollout_backend"] = auto_rollout_line(_importable("vllm"), "cuda" if gpus else "cpu")
    return info


def auto_rollout_line(has_vllm: bool, device_type: str) -> str:
    """What `rollout_backend: auto` picks for online RL on this machine (one process), and why."""
    from .config.resolve import RunFacts, resolve_rollout_backend

    picked = resolve_rollout_backend("auto", RunFacts(device_type=device_type, has_vllm=has_vllm))
    if picked == "vllm":
        return "auto -> vllm (installed, CUDA GPU)"
    why = "no CUDA GPU" if has_vllm else "vllm not installed" if device_type == "cuda" else \
        "vllm not installed, no CUDA GPU"
    return f"auto -> {picked}: transformers generate ({why})"
