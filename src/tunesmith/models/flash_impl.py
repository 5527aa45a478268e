"""The kernels behind PyTorch's FlashAttention ops: its built-in FlashAttention-2 port, or FlashAttention 4.

tunesmith's variable-length attention (models/attention.py) calls `aten::_flash_attention_forward`, and SDPA's
flash backend calls its sibling. PyTorch (2.10 and later) lets a kernel provider replace what runs behind those
ops: `torch.nn.attention.activate_flash_attention_impl("FA4")` routes them to flash-attn-4's CuTe kernels, which
have Hopper and Blackwell forward and backward passes. The attention the YAML chose stays PyTorch's op; only the
kernel behind it changes, and the log says which.

FlashAttention 4 compiles each kernel at its first call (seconds); its persistent cache, switched on here unless
the environment says otherwise, keeps them for the next run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

from ..errors import ModelError

log = logging.getLogger("tunesmith")
_active: str | None = None


def fa4_unavailable(device: torch.device) -> str | None:
    """Why FlashAttention 4 cannot run here, or None when it can."""
    if device.type != "cuda":
        return "it needs a CUDA GPU"
    attention = torch.nn.attention
    if "FA4" not in getattr(attention, "list_flash_attention_impls", lambda: [])():
        return f"PyTorch {torch.__version__} cannot route its FlashAttention ops to it (2.10 or later can)"
    if not _installed("flash_attn.cute"):
        return "the flash-attn-4 package is not installed (pip install flash-attn-4)"
    if torch.cuda.get_device_capability(device)[0] not in (9, 10):
        return "it runs on Hopper (sm90) and Blackwell (sm100) GPUs only"
    return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def activate(choice: str, device: torch.device) -> str:
    """flash_impl (auto | fa2 | fa4) -> the implementation PyTorch's FlashAttention ops run from now on in this
    process, "FA2" (PyTorch's own) or "FA4"."""
    global _active
    if choice == "fa2":
        return _active or "FA2"
    reason = fa4_unavailable(device)
    if reason is not None:
        if choice == "fa4":
            raise ModelError(f"flash_impl: fa4 (FlashAttention 4) cannot be used: {reason}; "
                             "set flash_impl: auto or fa2 for PyTorch's built-in FlashAttention-2")
        return _active or "FA2"
    if _active != "FA4":
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
                              str(Path.home() / ".cache" / "tunesmith" / "flash-attention-4"))
        try:
            torch.nn.attention.activate_flash_attention_impl("FA4")
        except (ImportError, RuntimeError) as error:  # a broken install (the CuTe DSL's libraries, its CUDA build)
            if choice == "fa4":
                raise ModelError(f"flash_impl: fa4: FlashAttention 4 did not load ({error}); reinstall flash-attn-4, "
                                 "or set flash_impl: auto or fa2") from error
            log.warning("flash_impl: auto: FlashAttention 4 is installed but did not load (%s); PyTorch's built-in "
                        "FlashAttention-2 runs", error)
            return "FA2"
        _active = "FA4"
        log.info("flash_impl: PyTorch's FlashAttention ops run FlashAttention 4 (flash-attn-4, compiled kernels "
                 "cached in %s); flash_impl: fa2 keeps PyTorch's built-in kernels",
                 os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"])
    return _active
