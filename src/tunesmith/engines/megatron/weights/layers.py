"""The name and layout map shared by the text families: Hugging Face decoder layers <-> megatron-core's
GPTModel (local layer spec). Pure tensor functions; nothing here imports megatron-core.

megatron-core fuses what Hugging Face keeps apart:
  - linear_qkv holds, for each query group (KV head) in turn, that group's query heads, then its key
    head, then its value head: [groups x (heads_per_group + 2) x head_dim, hidden];
  - linear_fc1 holds the gate projection, then the up projection (its GLU chunks the output in two).
Every other weight is renamed only. The HF side uses the module names of models/families.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....models.families import ATTENTION_Q_K_V_O, GATED_MLP

Q, K, V, O = ATTENTION_Q_K_V_O
GATE, UP, DOWN = GATED_MLP


@dataclass(frozen=True)
class Shape:
    """What the maps need of a Hugging Face text config."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    tied: bool  # the output layer is the input embedding

    @classmethod
    def of(cls, config) -> "Shape":
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.num_hidden_layers, heads, getattr(config, "num_key_value_heads", None) or heads, head_dim,
                   config.hidden_size, bool(getattr(config, "tie_word_embeddings", False)))


@dataclass(frozen=True)
class Layout:
    """Which optional weights a family's layers carry."""

    qkv_bias: bool = False  # Qwen2 / Qwen2.5 (and Llama with attention_bias)
    qk_norm: bool = False  # Qwen3: RMSNorm on each query and key head


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape) -> torch.Tensor:
    """HF q/k/v projections (weights [out, in] or biases [out]) -> megatron's grouped linear_qkv."""
    groups, per_group, dim = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * dim, *rest)
    k = k.reshape(groups, dim, *rest)
    v = v.reshape(groups, dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """megatron's grouped linear_qkv -> HF q, k, v (the inverse of fuse_qkv)."""
    groups, per_group, dim = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * dim, *rest)
    q, k, v = torch.split(grouped, [per_group * dim, dim, dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate, up


def _hf_layer(i: int) -> str:
    return f"model.layers.{i}."


def _mc_layer(i: int) -> str:
    return f"decoder.layers.{i}."


def attention_to_megatron(hf: dict, i: int, shape: Shape, layout: Layout) -> dict:
    a, m = _hf_layer(i) + "self_attn.", _mc_layer(i) + "self_attention."
    out = {m + "linear_qkv.weight": fuse_qkv(hf[a + Q + ".weight"], hf[a + K + ".weight"], hf[a + V + ".weight"],
                                             shape),
           m + "linear_proj.weight": hf[a + O + ".weight"],
           _mc_layer(i) + "input_layernorm.weight": hf[_hf_layer(i) + "input_layernorm.weight"],
           _mc_layer(i) + "pre_mlp_layernorm.weight": hf[_hf_layer(i) + "post_attention_layernorm.weight"]}
    if layout.qkv_bias:
        out[m + "linear_qkv.bias"] = fuse_qkv(hf[a + Q + ".bias"], hf[a + K + ".bias"], hf[a + V + ".bias"], shape)
    if layout.qk_norm:
        out[m + "q_layernorm.weight"] = hf[a + "q_norm.weight"]
        out[m + "k_layernorm.weight"] = hf[a + "k_norm.weight"]
    return out


def attention_to_hf(mc: dict, i: int, shape: Shape, layout: Layout) -> dict:
    a, m = _hf_layer(i) + "self_attn.", _mc_layer(i) + "self_attention."
    q, k, v = split_qkv(mc[m + "linear_qkv.weight"], shape)
    out = {a + Q + ".weight": q, a + K + ".weight": k, a + V + ".weight": v,
           a + O + ".weight": mc[m + "linear_proj.weight"],
           _hf_layer(i) + "input_layernorm.weight": mc[_mc_layer(i) + "input_layernorm.weight"],
           _hf_layer(i) + "post_attention_layernorm.weight": mc[_mc_layer(i) + "pre_mlp_layernorm.weight"]}
    if layout.qkv_bias:
        out.update(zip((a + n + ".bias" for n in (Q, K, V)), split_qkv(mc[m + "linear_qkv.bias"], shape)))
    if layout.qk_norm:
        out[a + "q_norm.weight"] = mc[m + "q_layernorm.weight"]
        out[a + "k_norm.weight"] = mc[m + "k_layernorm.weight"]
    return out


def dense_mlp_to_megatron(hf: dict, i: int) -> dict:
    h, m = _hf_layer(i) + "mlp.", _mc_layer(i) + "mlp."
    return {m + "linear_fc1.weight": fuse_gate_up(hf[h + GATE + ".weight"], hf[h + UP + ".weight"]),
            m + "linear_fc2.weight": hf[h + DOWN + ".weight"]}


def dense_mlp_to_hf(mc: dict, i: int) -> dict:
    h, m = _hf_layer(i) + "mlp.", _mc_layer(i) + "mlp."
    gate, up = split_gate_up(mc[m + "linear_fc1.weight"])
    return {h + GATE + ".weight": gate, h + UP + ".weight": up, h + DOWN + ".weight": mc[m + "linear_fc2.weight"]}


def outer_to_megatron(hf: dict, shape: Shape) -> dict:
    """Embedding, final norm and (a language model's; a reward model has none) the LM head."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not shape.tied and "lm_head.weight" in hf:
        out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def outer_to_hf(mc: dict, shape: Shape) -> dict:
    embed = mc["embedding.word_embeddings.weight"]
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": mc["decoder.final_layernorm.weight"]}
    if shape.tied or "output_layer.weight" in mc:
        out["lm_head.weight"] = embed if shape.tied else mc["output_layer.weight"]
    return out


def convert_to_megatron(hf: dict, shape: Shape, layout: Layout, mlp_to_megatron=dense_mlp_to_megatron) -> dict:
    out = outer_to_megatron(hf, shape)
    for i in range(shape.num_layers):
        out.update(attention_to_megatron(hf, i, shape, layout))
        out.update(mlp_to_megatron(hf, i))
    return out


def convert_to_hf(mc: dict, shape: Shape, layout: Layout, mlp_to_hf=dense_mlp_to_hf) -> dict:
    out = outer_to_hf(mc, shape)
    for i in range(shape.num_layers):
        out.update(attention_to_hf(mc, i, shape, layout))
        out.update(mlp_to_hf(mc, i))
    return out
