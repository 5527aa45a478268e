"""RMSNorm on a training step: our Triton kernels on CUDA (`models/rms_norm_triton.py`; TRITON_NORMS), PyTorch's
fused kernel or Liger's elsewhere.

History: Liger's RMSNorm is a Triton kernel launched from Python; its forward and backward cost 0.6-0.7 ms of
host time per norm on an H200 (benchmarks/results/2026-12-04-step-sync-and-norms.md), so norms over the hidden
size went to PyTorch's fused kernel (a quarter of the host time). The step is GPU-bound now, and there PyTorch's
backward reduces the weight gradient in a second, slow kernel and Liger's backward over the q/k heads' 128
features is 5x its bytes; rms_norm_triton does both in one pass. Off CUDA the former choice stays: PyTorch's
fused kernel over the hidden size, Liger's own forward over the heads.

Numerics: as Liger's, the output has the input's dtype; under bf16 autocast the fp32 residual stream is
normalised in fp32 exactly as transformers does (up to the order of the sum); a half-precision input over the
hidden size is normalised and scaled in fp32 and rounded once, over the heads (Liger's and transformers' form)
rounded after the normalisation and again after the weight. One exception saves a cast: the pre-norms of the
dense decoder layers named in PRE_NORM_LAYERS, whose output only the attention's and the MLP's linears read,
write the autocast dtype straight away under autocast, which is the value those linears' cast would give.

Those layers' training forward also adds the attention's output to the residual stream and normalises the sum in
one kernel (`_pre_norm_layer_forward`, rms_norm_triton.add_rms_norm): the same sum in the same dtype, the same
norm. The MLP's output is added the same way, together with the norm that reads the sum next (the next layer's
input norm, or the model's final norm after the last layer): the layer leaves that norm's output on the norm
module (its HANDOFF attribute), which returns it when it is called on that very sum. So the residual stream is read and
written once an add, and its gradient is summed inside the backward kernels, not by separate adds and casts. A
norm whose weight this layer does not hold whole (sharded by FSDP2 or ZeRO-3) or whose layer is checkpointed is
left to compute its own. Anything else (generation with a cache, no gradients, off CUDA) runs the layer's own
forward.
"""

from __future__ import annotations

import functools
import sys

import torch


def fused_rms_norm(module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The forward of a Llama-style RMSNorm (module.weight, module.variance_epsilon) in PyTorch's kernel, in the
    input's dtype (as Liger's): normalised and scaled in fp32, rounded once."""
    weight = module.weight.to(hidden.dtype)  # a bf16 copy of the q/k norms' 128 weights under autocast
    return torch.nn.functional.rms_norm(hidden, module.weight.shape, weight, module.variance_epsilon)


# Measured on issue 15's workload (benchmarks/results/2026-12-05-triton-norms.md, one H100): training 6.6% faster
# (38.5k against 36.1-36.2k tokens/s), the same losses; their GPU tests pass (tests/gpu/test_step_sync_gpu.py).
TRITON_NORMS = True
NARROWEST = 512  # narrower norms (the q/k heads' 64-256 features) keep Liger's rounding (module docstring)
PRE_NORM_LAYERS = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer",
                             "Qwen2VLDecoderLayer", "Qwen2_5_VLDecoderLayer", "Qwen3VLTextDecoderLayer"})
PRE_NORMS = ("input_layernorm", "post_attention_layernorm")
HANDOFF = "_tunesmith_handed_off"  # a norm module's attribute: (the sum a layer wrote, this norm's output of it)


def _on_triton(hidden: torch.Tensor) -> bool:
    """Whether the Triton kernels run here (CUDA; the CPU tests run them in Triton's interpreter)."""
    return TRITON_NORMS and hidden.is_cuda


def norm_forward(module: torch.nn.Module, hidden: torch.Tensor, *, fallback, half_output: bool) -> torch.Tensor:
    """A Liger RMSNorm's forward: the output a layer handed off for this very input, else the Triton kernels on
    CUDA, `fallback` elsewhere."""
    handed = module.__dict__.pop(HANDOFF, None)
    if handed is not None and handed[0] is hidden:
        return handed[1]
    if not _on_triton(hidden):
        return fallback(hidden)
    from .rms_norm_triton import rms_norm

    wide = module.weight.numel() >= NARROWEST
    out_dtype = _half_output_dtype(hidden) if half_output else hidden.dtype
    return rms_norm(hidden, module.weight, module.variance_epsilon, out_dtype=out_dtype,
                    round_normed=not wide and hidden.dtype != torch.float32)


def _half_output_dtype(hidden: torch.Tensor) -> torch.dtype:
    """A pre-norm's output dtype: the autocast dtype for an fp32 input under autocast, else the input's."""
    if hidden.dtype == torch.float32 and torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return hidden.dtype


def _pre_norm_layer_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, *args, reader=None,
                            **kwargs) -> torch.Tensor:
    """A dense pre-norm decoder layer's training forward with each residual add and the norm after it in one
    kernel; `reader` the norm that reads the layer's output next, as (norm, its layer or None, half output).
    transformers passes everything but the hidden states by keyword, and the attention takes them all."""
    if (args or not _on_triton(hidden_states) or not torch.is_grad_enabled() or kwargs.get("use_cache")
            or (getattr(layer, "gradient_checkpointing", False) and _checkpoints_in_forward())):
        return type(layer).forward(layer, hidden_states, *args, **kwargs)
    from .rms_norm_triton import add_rms_norm

    norm = layer.post_attention_layernorm
    attended, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
    hidden_states, normed = add_rms_norm(hidden_states, attended, norm.weight, norm.variance_epsilon,
                                         out_dtype=_half_output_dtype(hidden_states))
    branch = layer.mlp(normed)
    if reader is None or not _may_hand_off(layer, *reader[:2]):
        return hidden_states + branch
    next_norm, _, half_output = reader
    total, next_normed = add_rms_norm(hidden_states, branch, next_norm.weight, next_norm.variance_epsilon,
                                      out_dtype=_half_output_dtype(hidden_states) if half_output else None)
    next_norm.__dict__[HANDOFF] = (total, next_normed)
    return total


@functools.cache
def _checkpoints_in_forward() -> bool:
    """Whether transformers checkpoints a layer inside its class's `forward` (5.2x) rather than in `__call__`
    (5.17): then an instance's own forward would skip the checkpoint, and a checkpointed layer keeps the class's."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" not in vars(GradientCheckpointingLayer)


def _may_hand_off(layer: torch.nn.Module, next_norm: torch.nn.Module, next_layer: torch.nn.Module | None) -> bool:
    """Whether `layer` may compute `next_norm` for it: neither layer is checkpointed (a recomputed forward must
    take the same path as the first), and the norm's weight is held whole here (FSDP2 shards it into a DTensor
    until its own layer runs; ZeRO-3 partitions it, keeping a `ds_id`)."""
    if any(getattr(l, "gradient_checkpointing", False) for l in (layer, next_layer) if l is not None):
        return False
    return held_whole(next_norm.weight)


def held_whole(weight: torch.Tensor) -> bool:
    """Whether this process holds all of `weight`: not an FSDP2 DTensor shard, not a ZeRO-3 partition (`ds_id`)."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor here (and no 0.5 s import)
    return not (dtensor is not None and isinstance(weight, dtensor.DTensor)) and not hasattr(weight, "ds_id")


def _pre_norms(model: torch.nn.Module) -> set[int]:
    """ids of the norms whose output only linear layers read (PRE_NORMS of PRE_NORM_LAYERS)."""
    return {id(getattr(layer, name)) for layer in model.modules() if type(layer).__name__ in PRE_NORM_LAYERS
            for name in PRE_NORMS if hasattr(layer, name)}


def use_fused_rms_norms(model: torch.nn.Module) -> int:
    """Give every Liger RMSNorm of Llama's form (no weight offset, Llama casting, ungrouped) norm_forward;
    Gemma-style norms (1 + weight) keep Liger's. Returns how many were changed."""
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        return 0
    pre_norms = _pre_norms(model)
    changed, replaced = 0, set()
    for module in model.modules():
        if (isinstance(module, LigerRMSNorm) and module.offset == 0.0 and module.casting_mode == "llama"
                and getattr(module, "weight", None) is not None
                and getattr(module, "group_size", None) is None):  # Liger's grouped RMSNorm normalises groups
            wide = module.weight.numel() >= NARROWEST
            fallback = fused_rms_norm.__get__(module) if wide else type(module).forward.__get__(module)
            module.forward = functools.partial(norm_forward, module, fallback=fallback,
                                               half_output=id(module) in pre_norms)
            changed += 1
            replaced.add(id(module))
    readers = _readers(model, replaced, pre_norms)
    for layer in model.modules() if TRITON_NORMS else ():
        if type(layer).__name__ in PRE_NORM_LAYERS and id(getattr(layer, "post_attention_layernorm", None)) in (
                replaced & pre_norms):
            layer.forward = functools.partial(_pre_norm_layer_forward, layer, reader=readers.get(id(layer)))
    return changed


def _readers(model: torch.nn.Module, replaced: set[int], pre_norms: set[int]) -> dict[int, tuple]:
    """For each dense decoder layer, by id: the replaced norm that reads its output next, as `reader` of
    _pre_norm_layer_forward: the next layer's input norm, or for the last layer its model's final `norm`."""
    readers = {}
    for decoder in model.modules():
        layers = getattr(decoder, "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            continue
        following = [(getattr(layer, "input_layernorm", None), layer) for layer in list(layers)[1:]]
        following.append((getattr(decoder, "norm", None), None))
        for layer, (norm, next_layer) in zip(layers, following):
            if (type(layer).__name__ in PRE_NORM_LAYERS and norm is not None and id(norm) in replaced
                    and norm.weight.numel() >= NARROWEST):
                readers[id(layer)] = (norm, next_layer, id(norm) in pre_norms)
    return readers
