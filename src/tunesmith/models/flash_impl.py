"""Which FlashAttention kernels tunesmith's variable-length attention runs: PyTorch's built-in FlashAttention-2
port, or FlashAttention 4.

The varlen attention (models/attention.flash_varlen: packed rows, and a Qwen-VL vision tower's images) calls
PyTorch's `aten::_flash_attention_forward` by default. With the flash-attn-4 package installed and a Hopper or
Blackwell GPU, `flash_impl: auto` (or `fa4`) sends the same calls to FlashAttention 4's variable-length function
(its CuTe kernels, forward and backward) instead. The call goes to flash-attn-4 directly, not through PyTorch's
`activate_flash_attention_impl("FA4")`: torch 2.11's routing expects an older flash-attn-4 return signature, and
SDPA's own flash backend stays PyTorch's.

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
_fa4 = {"choice": None, "checked": False}  # choice: the flash_impl that switched FlashAttention 4 on, or None


def fa4_unavailable(device: torch.device) -> str | None:
    """Why FlashAttention 4 cannot run here, or None when it can."""
    if device.type != "cuda":
        return "it needs a CUDA GPU"
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


def active() -> str:
    return "FA4" if _fa4["choice"] else "FA2"


def activate(choice: str, device: torch.device) -> str:
    """flash_impl (auto | fa2 | fa4) -> the kernels the varlen attention runs from now on in this process,
    "FA2" (PyTorch's own) or "FA4"."""
    if choice == "fa2" or _fa4["choice"]:
        return active()
    reason = fa4_unavailable(device)
    if reason is None:
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
                              str(Path.home() / ".cache" / "tunesmith" / "flash-attention-4"))
        try:
            import flash_attn.cute.interface  # noqa: F401  (the CuTe DSL's libraries load here)
        except ImportError as error:
            reason = f"it did not load ({error}); reinstall flash-attn-4"
    if reason is not None:
        if choice == "fa4":
            raise ModelError(f"flash_impl: fa4 (FlashAttention 4) cannot be used: {reason}; "
                             "set flash_impl: auto or fa2 for PyTorch's built-in FlashAttention-2")
        if "did not load" in reason:
            log.warning("flash_impl: auto: FlashAttention 4 is installed but %s; PyTorch's FlashAttention-2 runs",
                        reason)
        return "FA2"
    _fa4.update(choice=choice, checked=False)
    log.info("flash_impl: the varlen attention runs FlashAttention 4 (flash-attn-4; kernels compiled at their first "
             "call, cached in %s); flash_impl: fa2 keeps PyTorch's built-in FlashAttention-2",
             os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"])
    return "FA4"


def fa4_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale, causal: bool):
    """FlashAttention 4's variable-length attention (q [N, H, D], k/v [Nk, Hkv, D], half dtype) -> [N, H, D], or
    None when it is off. Its first call is checked: under auto a failure there (a kernel that does not compile on
    this GPU or CUDA) switches FlashAttention 4 off for the process and the caller runs PyTorch's kernel."""
    if not _fa4["choice"]:
        return None
    if _fa4["checked"]:
        return _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
    try:
        out = _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
    except Exception as error:  # noqa: BLE001 - whatever the compiler raised: fall back or say so
        if _fa4["choice"] == "fa4":
            raise ModelError(f"flash_impl: fa4: FlashAttention 4's first call failed ({type(error).__name__}: "
                             f"{error}); set flash_impl: auto or fa2") from error
        log.warning("flash_impl: auto: FlashAttention 4's first call failed (%s: %s); PyTorch's FlashAttention-2 "
                    "runs from here on", type(error).__name__, error)
        _fa4["choice"] = None
        return None
    _fa4["checked"] = True
    return out


@torch.compiler.disable  # compiled blocks (torch_compile: true) call it as an opaque kernel
def _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal):
    from flash_attn.cute.interface import flash_attn_varlen_func

    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                 max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=scale,
                                 causal=causal)
    return out[0] if isinstance(out, tuple) else out
