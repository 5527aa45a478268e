"""Which FlashAttention kernels tunesmith's variable-length attention runs: PyTorch's built-in FlashAttention-2
port, or FlashAttention 4.

The varlen attention (models/attention.flash_varlen: packed rows, a Qwen-VL vision tower's images, the Megatron
engine's packed rows) calls PyTorch's `aten::_flash_attention_forward` by default. With the flash-attn-4 package
installed and a Hopper or Blackwell GPU, `flash_impl: auto` (or `fa4`) sends the same calls to FlashAttention 4's
variable-length function (its CuTe kernels, forward and backward) instead. The call goes to flash-attn-4 directly,
not through PyTorch's `activate_flash_attention_impl("FA4")`: torch 2.11's routing expects an older flash-attn-4
return signature, and SDPA's own flash backend stays PyTorch's.

FlashAttention 4 compiles a kernel for each head size, grouped-query ratio and causality at its first call
(seconds); its persistent cache, switched on here unless the environment says otherwise, keeps them for the next
run. The first forward of each such kernel is checked: under `auto` a failure there switches FlashAttention 4 off
for the rest of the process (PyTorch's kernel runs), under `fa4` it stops the run.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from dataclasses import dataclass, field

import torch

from ..errors import ModelError

log = logging.getLogger("tunesmith")
FA4_PACKAGE = "flash-attn-4"


@dataclass
class _FA4:
    choice: str | None = None  # the flash_impl that switched FlashAttention 4 on (auto | fa4), or None: off
    failed: bool = False  # it failed under auto: off for the rest of the process
    checked: set = field(default_factory=set)  # kernels (head size, GQA ratio, causal, dtype) whose forward ran
    varlen_func: object = None


_fa4 = _FA4()


def fa4_unavailable(device: torch.device) -> str | None:
    """Why FlashAttention 4 cannot run here, or None when it can."""
    if device.type != "cuda":
        return "it needs a CUDA GPU"
    try:
        importlib.metadata.version(FA4_PACKAGE)
    except importlib.metadata.PackageNotFoundError:  # flash-attn 2 ships a flash_attn.cute folder too: ask pip's record
        return f"the {FA4_PACKAGE} package is not installed (pip install {FA4_PACKAGE})"
    if torch.cuda.get_device_capability(device)[0] not in (9, 10):
        return "it runs on Hopper (sm90) and Blackwell (sm100) GPUs only"
    return None


def activate(choice: str, device: torch.device, attention: str, varlen: bool) -> None:
    """flash_impl (auto | fa2 | fa4) for a run whose attention is `attention` (`varlen`: tunesmith's varlen
    attention), once, on the compute device."""
    if choice == "fa2" or _fa4.choice or _fa4.failed:
        return
    if not varlen:
        if choice == "fa4":
            raise ModelError(f"flash_impl: fa4 runs FlashAttention 4 in the varlen attention, and this run's attention "
                             f"is '{attention}' (varlen needs flash_attn: auto, sdpa or varlen, a CUDA GPU, bf16 or "
                             "fp16 and a model without sliding-window layers); set flash_impl: auto or fa2")
        return
    reason = fa4_unavailable(device)
    if reason is None:
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
        try:
            from flash_attn.cute.interface import flash_attn_varlen_func  # the CuTe DSL's libraries load here
        except Exception as error:  # noqa: BLE001 - ImportError, OSError of a library, RuntimeError of CUDA
            reason = f"it did not load ({type(error).__name__}: {error}); reinstall {FA4_PACKAGE}"
            if choice == "auto":
                log.warning("flash_impl: auto: FlashAttention 4 is installed but %s; PyTorch's FlashAttention-2 runs",
                            reason)
                return
    if reason is not None:
        if choice == "fa4":
            raise ModelError(f"flash_impl: fa4 (FlashAttention 4) cannot be used: {reason}; set flash_impl: auto or "
                             "fa2 for PyTorch's built-in FlashAttention-2")
        return
    _fa4.choice, _fa4.varlen_func = choice, flash_attn_varlen_func
    log.info("flash_impl: the varlen attention runs FlashAttention 4 (%s %s; kernels compiled at their first call, "
             "cached when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, now %s); flash_impl: fa2 keeps PyTorch's "
             "FlashAttention-2", FA4_PACKAGE, importlib.metadata.version(FA4_PACKAGE),
             os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"])


def fa4_on(dropout: float) -> bool:
    """Whether flash_varlen runs FlashAttention 4 for a call with this dropout (FlashAttention 4 has none)."""
    if not _fa4.choice:
        return False
    if dropout > 0.0 and _fa4.choice == "fa4":
        raise ModelError("flash_impl: fa4: FlashAttention 4 has no attention dropout, and this model's is "
                         f"{dropout}; set flash_impl: auto (PyTorch's kernel for it) or fa2")
    return dropout == 0.0


def fa4_varlen(q_NHD, k_NHD, v_NHD, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale,
               causal: bool):
    """FlashAttention 4's variable-length attention (half dtype; k/v [Nk, Hkv, D]) -> [N, H, D], or None when its
    first forward of this kernel failed under auto (the caller runs PyTorch's kernel from here on)."""
    kernel = (q_NHD.shape[-1], q_NHD.shape[1] // k_NHD.shape[1], causal, q_NHD.dtype)
    if kernel in _fa4.checked:
        return _call(q_NHD, k_NHD, v_NHD, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
    try:
        out = _call(q_NHD, k_NHD, v_NHD, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the kernel compiler raised: fall back or say so
        if _fa4.choice == "fa4":
            raise ModelError(f"flash_impl: fa4: FlashAttention 4's first call of a kernel {kernel} failed "
                             f"({type(error).__name__}: {error}); set flash_impl: auto or fa2") from error
        log.warning("flash_impl: auto: FlashAttention 4's first call of a kernel %s failed (%s: %s); PyTorch's "
                    "FlashAttention-2 runs from here on", kernel, type(error).__name__, error)
        _fa4.choice, _fa4.failed = None, True
        return None
    _fa4.checked.add(kernel)
    return out


@torch.compiler.disable  # compiled blocks (torch_compile: true) call it as an opaque kernel (a graph break)
def _call(q_NHD, k_NHD, v_NHD, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal):
    out = _fa4.varlen_func(q_NHD, k_NHD, v_NHD, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                           max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=scale, causal=causal)
    return out[0] if isinstance(out, tuple) else out
