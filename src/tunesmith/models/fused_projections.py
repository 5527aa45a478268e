"""One matmul for the linear layers that read the same input: an attention's q/k/v projections, a gated MLP's
gate and up projections.

A Qwen3 layer runs seven linear layers; q, k and v read the same normed hidden states, as do gate and up. Apart,
they are five matmuls forward and ten backward (each input gradient, each weight gradient), plus the adds that
sum the three (two) input gradients, and each is a separately launched kernel with its own host time. Stacked,
they are two matmuls forward and four backward, over wider outputs, which the GEMM tiles better. The weights stay
separate parameters (checkpoints, optimiser state and LoRA targets are unchanged): each forward writes them into
one stacked copy in the compute dtype, which is the cast every linear made anyway, and the weight gradients are
row slices of one matmul's fp32 output.

Numerics: the same products in the same dtype (autocast's), accumulated by one GEMM instead of several; a weight's
gradient is written in its own dtype by the matmul, as models/autocast_linear does for a single linear. The gated
MLP applies silu(gate) * up to the stacked output with models/swiglu_triton on CUDA (computed in fp32, rounded
once) and the MLP's own activation elsewhere.

Qwen3's attention normalises q and k per head before RoPE; there the attention's forward itself is replaced
(`_qwen3_attention_forward`): the stacked matmul, then models/qk_norm_rope's one kernel for the q/k norms and RoPE
reading the q/k heads where the matmul wrote them, then the model's attention implementation as transformers
calls it.

Installed by the single-device engine for the dense decoder layers of models/norms.PRE_NORM_LAYERS, where the
projections are plain nn.Linear. Stacking runs under autocast over weights of another dtype (fp32 masters under
bf16), where the stacked copy replaces the casts; without autocast (pure bf16, fp32) it would be an extra copy of
the weights, kept for the backward, so the layers run apart. Frozen weights are stacked without gradients; where
LoRA wraps q, k or v afterwards the layers' own forwards run (the engines apply LoRA first, so LoRA targets are
never stacked). Anything else (weights that differ in dtype or trainability, a forward under torch.compile's
tracing) takes the layers' own forwards. The stacked forwards call no hooks of the modules they stand in for
(Qwen3's q/k/v and q/k norms), and q/k/v's outputs are views of one tensor, not to be changed in place.
"""

from __future__ import annotations

import copy
import functools

import torch
from torch.nn import functional as F

from . import norms
from .autocast_linear import mm_out_dtype
from .kernels import tensor_version


class _StackedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dtype, with_bias, *params):
        count = len(params) // 2 if with_bias else len(params)
        weights, biases = params[:count], params[count:]
        stacked = _stack(weights, dtype)
        x_cast = x.to(dtype)
        ctx.save_for_backward(x_cast, stacked)
        ctx.widths = [w.shape[0] for w in weights]
        ctx.x_dtype, ctx.w_dtype = x.dtype, weights[0].dtype
        ctx.b_dtype = biases[0].dtype if biases else None
        bias = torch.cat([b.to(dtype) for b in biases]) if biases else None
        return F.linear(x_cast, stacked, bias)

    @staticmethod
    def backward(ctx, grad):
        x_cast, stacked = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1]).to(stacked.dtype)
        count = len(ctx.widths)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = mm_out_dtype(rows, stacked, ctx.x_dtype).view(*grad.shape[:-1], stacked.shape[1])
        weight_grads = [None] * count
        if any(ctx.needs_input_grad[3:3 + count]):
            full = mm_out_dtype(rows.t(), x_cast.reshape(-1, x_cast.shape[-1]), ctx.w_dtype)
            weight_grads = list(full.split(ctx.widths, dim=0))
        bias_grads = [None] * (count if ctx.b_dtype is not None else 0)
        if any(ctx.needs_input_grad[3 + count:]):
            bias_grads = list(rows.sum(0, dtype=ctx.b_dtype).split(ctx.widths))
        return (grad_x, None, None, *weight_grads, *bias_grads)


def _stack(weights, dtype: torch.dtype) -> torch.Tensor:
    """The weights one above the other in `dtype`: one copy kernel per weight (the casts a linear each makes)."""
    stacked = torch.empty(sum(w.shape[0] for w in weights), weights[0].shape[1], dtype=dtype,
                          device=weights[0].device)
    start = 0
    for w in weights:
        stacked[start:start + w.shape[0]].copy_(w)
        start += w.shape[0]
    return stacked


def stacked_linear(x: torch.Tensor, linears, dtype: torch.dtype) -> torch.Tensor:
    """The outputs of `linears` (nn.Linear over the same input features) side by side: x @ [W1; W2; ...]^T
    computed in `dtype`, each weight's gradient in its own dtype."""
    params = [m.weight for m in linears]
    if linears[0].bias is not None:
        params += [m.bias for m in linears]
    return _StackedLinear.apply(x, dtype, linears[0].bias is not None, *params)


def compute_dtype(linears, x: torch.Tensor) -> torch.dtype | None:
    """The dtype a stacked matmul of `linears` on `x` computes in (autocast's), or None where they run apart:
    without autocast or with weights already in its dtype (pure bf16, fp32: the stacked copy would be a new copy,
    kept for the backward, where each linear keeps a reference to its weight), weights of different dtypes,
    devices or trainability, a bias on some only, weights sharded (FSDP2's DTensor, ZeRO-3's partitions), or
    torch.compile tracing the forward."""
    first = linears[0].weight
    device = x.device.type
    if torch.compiler.is_compiling() or not first.is_floating_point() or not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    if dtype == first.dtype:
        return None
    for m in linears:
        w = m.weight
        if (w.dtype != first.dtype or w.device != first.device or w.requires_grad != first.requires_grad
                or w.shape[1] != first.shape[1] or (m.bias is None) != (linears[0].bias is None)
                or not norms.held_whole(w)):
            return None
    return dtype


class _SameInputGroup:
    """Linear layers a forward calls one after another on the same input (q, k, v): the first call computes all
    their outputs in one stacked matmul and keeps the others', which the next calls return when they get that
    very input (by identity and version); any other call runs the layer's own forward."""

    def __init__(self, linears):
        self.linears = linears
        self.forwards = [m.forward for m in linears]
        self.source: tuple[torch.Tensor, int | None] | None = None
        self.kept: dict[int, torch.Tensor] = {}

    def __deepcopy__(self, memo):
        """A copy of the model (DPO's frozen reference) gets a group over its own layers, with nothing kept."""
        copied = memo[id(self)] = _SameInputGroup.__new__(_SameInputGroup)
        copied.linears, copied.forwards = copy.deepcopy(self.linears, memo), copy.deepcopy(self.forwards, memo)
        copied.source, copied.kept = None, {}
        return copied

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if index == 0:
            self.source, self.kept = None, {}
            dtype = compute_dtype(self.linears, x)
            if dtype is not None:
                outputs = stacked_linear(x, self.linears, dtype).split([m.out_features for m in self.linears], -1)
                self.source, self.kept = (x, tensor_version(x)), dict(enumerate(outputs[1:], start=1))
                return outputs[0]
        elif self.source is not None and self.source[0] is x and self.source[1] == tensor_version(x):
            out = self.kept.pop(index, None)
            if not self.kept:
                self.source = None
            if out is not None:
                return out
        return self.forwards[index](x)


def _still_plain(module: torch.nn.Module, names, linears) -> bool:
    """Whether `module`'s layers `names` are still the plain `linears` stacked at install time (LoRA applied later
    wraps them: then the module's own forward runs, adapters included)."""
    return all(getattr(module, name) is linear for name, linear in zip(names, linears))


def _gated_mlp_forward(mlp: torch.nn.Module, x: torch.Tensor, *, pair, plain) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) with gate and up as one stacked matmul (module docstring), else `plain`: also
    where gate or up is no longer the plain layer `pair` holds."""
    dtype = compute_dtype(pair, x) if _still_plain(mlp, ("gate_proj", "up_proj"), pair) else None
    if dtype is None:
        return plain(x)
    both = stacked_linear(x, pair, dtype)
    if both.is_cuda:
        from .swiglu_triton import swiglu

        return mlp.down_proj(swiglu(both))
    gate, up = both.chunk(2, dim=-1)
    return mlp.down_proj(F.silu(gate) * up)


STACKED = "_tunesmith_stacked"  # a decoder layer's attribute: fuse_projections has been through it
_OWN_ARGUMENTS = ("hidden_states", "position_embeddings", "attention_mask", "past_key_values", "cache")


def _qwen3_attention_forward(attention: torch.nn.Module, *args, linears, plain, **kwargs):
    """Qwen3's attention with q/k/v stacked and its q/k norms and RoPE in one kernel (models/qk_norm_rope.py),
    then the model's attention implementation as transformers calls it; `plain` (the layer's own forward) for a
    call with a KV cache, positional arguments, eager attention or weights that cannot be stacked."""
    hidden = kwargs.get("hidden_states")
    implementation = attention.config._attn_implementation
    if (args or hidden is None or kwargs.get("position_embeddings") is None or implementation == "eager"
            or kwargs.get("past_key_values") is not None or kwargs.get("cache") is not None
            or not norms._on_triton(hidden)
            or not _still_plain(attention, ("q_proj", "k_proj", "v_proj"), linears)):
        return plain(*args, **kwargs)
    dtype = compute_dtype(linears, hidden)
    if dtype is None:
        return plain(*args, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from .qk_norm_rope import qk_norm_rope

    dim = attention.head_dim
    heads, kv_heads = linears[0].out_features // dim, linears[1].out_features // dim
    batch_shape = hidden.shape[:-1]
    qk, v = stacked_linear(hidden, linears, dtype).split([(heads + kv_heads) * dim, kv_heads * dim], -1)
    cos, sin = kwargs["position_embeddings"]  # [B or 1, T, D]: the kernel reads a batch's shared rows in place
    q, k = qk_norm_rope(qk.reshape(-1, heads + kv_heads, dim), attention.q_norm.weight, attention.k_norm.weight,
                        cos, sin, heads, attention.q_norm.variance_epsilon)
    q, k, v = (t.view(*batch_shape, -1, dim).transpose(1, 2) for t in (q, k, v))
    rest = {key: value for key, value in kwargs.items() if key not in _OWN_ARGUMENTS}
    out, weights = ALL_ATTENTION_FUNCTIONS[implementation](
        attention, q, k, v, kwargs.get("attention_mask"),
        dropout=attention.attention_dropout if attention.training else 0.0, scaling=attention.scaling,
        sliding_window=getattr(attention, "sliding_window", None), **rest)
    return attention.o_proj(out.reshape(*batch_shape, -1).contiguous()), weights


def _norms_and_rope_fusable(attention: torch.nn.Module) -> bool:
    """A Qwen3 attention whose q/k norms run models/norms' Llama-form kernels with one epsilon, with a head width
    the fused kernel holds."""
    from .qk_norm_rope import supported

    pair = [getattr(attention, name, None) for name in ("q_norm", "k_norm")]
    return (type(attention).__name__ == "Qwen3Attention" and supported(getattr(attention, "head_dim", 0))
            and all(getattr(getattr(n, "forward", None), "func", None) is norms.norm_forward for n in pair)
            and pair[0].variance_epsilon == pair[1].variance_epsilon)


def _plain_linears(module: torch.nn.Module, names) -> list | None:
    linears = [getattr(module, name, None) for name in names]
    return linears if all(type(m) is torch.nn.Linear for m in linears) else None


def _silu_gated(mlp: torch.nn.Module) -> bool:
    """A gated MLP whose activation is silu: Liger's SwiGLU MLP, or transformers' MLP with silu."""
    act = getattr(mlp, "act_fn", None)
    return (type(mlp).__name__ == "LigerSwiGLUMLP" or isinstance(act, torch.nn.SiLU)
            or type(act).__name__ == "SiLUActivation")


def fuse_projections(model: torch.nn.Module) -> int:
    """Stack q/k/v and gate/up of every dense decoder layer (models/norms.PRE_NORM_LAYERS) whose projections are
    plain nn.Linear; returns how many groups were stacked."""
    fused = 0
    for layer in model.modules():
        if type(layer).__name__ not in norms.PRE_NORM_LAYERS or getattr(layer, STACKED, False):
            continue
        setattr(layer, STACKED, True)
        attention = getattr(layer, "self_attn", None)
        qkv = _plain_linears(attention, ("q_proj", "k_proj", "v_proj")) if attention is not None else None
        if qkv is not None and len({m.in_features for m in qkv}) == 1:
            group = _SameInputGroup(qkv)
            for index, linear in enumerate(qkv):
                linear.forward = functools.partial(group.forward, index)
            if _norms_and_rope_fusable(attention):
                attention.forward = functools.partial(_qwen3_attention_forward, attention, linears=qkv,
                                                      plain=attention.forward)
            fused += 1
        mlp = getattr(layer, "mlp", None)
        pair = _plain_linears(mlp, ("gate_proj", "up_proj")) if hasattr(mlp, "down_proj") else None
        if pair is not None and _silu_gated(mlp) and pair[0].out_features == pair[1].out_features:
            mlp.forward = functools.partial(_gated_mlp_forward, mlp, pair=tuple(pair), plain=mlp.forward)
            fused += 1
    return fused
