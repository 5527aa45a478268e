"""fp32 master weights from a checkpoint stored in bf16 or fp16, loaded in the checkpoint's dtype and upcast.

Asked for fp32, transformers converts each tensor on the CPU before copying it to the GPU: twice the bytes over the
bus plus a CPU pass (Qwen3-1.7B on the H200 machine: 1.7-1.8 s, against 1.0 s in bf16 and 0.04 s to upcast there).
The parameters come out the same bit for bit. So do the buffers, except those a half-precision build computes in
half at init (Gemma's embed_scale): those are taken from an fp32 build of the model without parameters. Weights the
checkpoint lacks (a new reward head) start from a half-precision initialisation, as in LLaMA-Factory, which loads
in half too.
"""

from __future__ import annotations

from pathlib import Path

import torch

_HALF = {"BF16": torch.bfloat16, "F16": torch.float16}
_FLOATING = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"}


def checkpoint_half_dtype(path) -> torch.dtype | None:
    """bf16 or fp16 when every floating tensor in the local folder's safetensors files has that dtype, else None."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    dtypes = set()
    for file in files:
        with safe_open(str(file), "pt") as f:  # the header only
            dtypes |= {f.get_slice(key).get_dtype() for key in f.keys()}
    floating = dtypes & _FLOATING
    return _HALF.get(floating.pop()) if len(floating) == 1 else None


def upcast_loaded(model, build_fp32) -> None:
    """`model`, loaded in half, to fp32 in place. build_fp32() builds the same model in fp32 on the meta device
    (buffers real): its buffers replace the non-persistent ones the half build computed below fp32."""
    low = {name for name, buffer in model.named_buffers() if buffer.is_floating_point()
           and buffer.dtype != torch.float32 and _non_persistent(model, name)}
    model.float()
    if not low:
        return
    built = dict(build_fp32().named_buffers())
    for name, buffer in model.named_buffers():
        if name in low and name in built:
            buffer.copy_(built[name])


def _non_persistent(model, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(owner)._non_persistent_buffers_set
