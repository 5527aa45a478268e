"""Tensor-parallel shard maps: which slice of each full megatron-core weight a TP rank holds.

Pure functions of full (unsharded) state dicts, as megatron-core's local layers split them:
  - column-parallel (output dimension split): linear_qkv, linear_fc1, the word embeddings and
    the output layer (vocabulary rows);
  - row-parallel (input dimension split): linear_proj, linear_fc2;
  - replicated: norms, the router, a mixture-of-experts model's experts (expert tensor parallelism 1: each rank
    runs its block of the sequence through whole experts) and a vision-language model's vision tower (a Hugging
    Face module).
linear_qkv is grouped per KV head, so rank r takes whole query groups: a contiguous block.
linear_fc1 is [gate; up], so rank r takes its block of the gate rows and of the up rows, and
its local GLU still chunks [gate_r; up_r] in two. The vocabulary tables are padded with zero rows
to a size every TP degree divides before they are split (padded_vocab_size, pad_vocabulary).
"""

from __future__ import annotations

import re

import torch

from ...errors import ConfigError

_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")
_GATED = ("linear_fc1.weight",)
_ROW = ("linear_proj.weight", "linear_fc2.weight")
_VOCABULARY = ("word_embeddings.weight", "output_layer.weight")
# Hugging Face modules the engine runs as they are (a vision tower, whose MLP is also called linear_fc1): whole on
# every rank
_HF_MODULES = ("visual.",)
_LORA = re.compile(r"\.lora_([AB])\.weight$")
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = 128) -> int:
    """The vocabulary rounded up so that each TP rank holds an equal number of rows (megatron's
    make_vocab_size_divisible_by x TP)."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def is_vocabulary(name: str) -> bool:
    """The weights with one row per vocabulary entry (the input embedding, the output layer)."""
    return name.endswith(_VOCABULARY)


def pad_vocabulary(name: str, tensor: torch.Tensor, padded_size: int) -> torch.Tensor:
    """A vocabulary table with zero rows appended up to `padded_size` (other weights unchanged). The engine masks
    the padding's logits out of the loss, and nothing looks its embedding rows up."""
    if not is_vocabulary(name) or tensor.shape[0] == padded_size:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(padded_size - tensor.shape[0], *tensor.shape[1:])])


def unpad_vocabulary(name: str, tensor: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return tensor[:vocab_size] if is_vocabulary(name) else tensor


def split_of(name: str) -> str:
    """How `name` is split over TP ranks: column, gated, row or replicated. A LoRA adapter's B is split as its
    column-parallel (or gated) linear's weight, its A as its row-parallel linear's; the other of the two is whole."""
    if name.startswith(_HF_MODULES) or _EXPERT.search(name):
        return "replicated"
    if match := _LORA.search(name):
        kind = split_of(name[:match.start()] + ".weight")
        return kind if kind != "replicated" and (match.group(1) == "B") == (kind != "row") else "replicated"
    if name.endswith(_GATED):
        return "gated"
    if name.endswith(_COLUMN):
        return "column"
    if name.endswith(_ROW):
        return "row"
    return "replicated"


def _blocks(tensor: torch.Tensor, tp: int, dim: int, name: str) -> tuple[torch.Tensor, ...]:
    if tensor.shape[dim] % tp:
        raise ConfigError([f"{name} has {tensor.shape[dim]} rows/columns along dimension {dim}, which "
                           f"tensor_model_parallel_size {tp} does not divide; pick a degree that divides it"])
    return torch.chunk(tensor, tp, dim=dim)


def shard(name: str, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """TP rank `rank`'s slice of the full weight `name`."""
    kind = split_of(name)
    if kind == "column":
        return _blocks(tensor, tp, 0, name)[rank]
    if kind == "row":
        return _blocks(tensor, tp, 1, name)[rank]
    if kind == "gated":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return torch.cat([_blocks(gate, tp, 0, name)[rank], _blocks(up, tp, 0, name)[rank]], dim=0)
    return tensor


def unshard(name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The full weight from every TP rank's slice, in rank order (the inverse of shard)."""
    kind = split_of(name)
    if kind == "column":
        return torch.cat(pieces, dim=0)
    if kind == "row":
        return torch.cat(pieces, dim=1)
    if kind == "gated":
        halves = [torch.chunk(p, 2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return pieces[0]


def shard_state(full: dict, tp: int, rank: int) -> dict:
    return {name: shard(name, tensor, tp, rank) for name, tensor in full.items()}


def unshard_states(per_rank: list[dict]) -> dict:
    return {name: unshard(name, [state[name] for state in per_rank]) for name in per_rank[0]}


def _renumbered(name: str, match, index: int) -> str:
    return name[:match.start(1)] + str(index) + name[match.end(1):]


def expert_layer(name: str) -> str | None:
    """The MoE layer (its name up to the experts) of an expert's weight; None for any other weight."""
    match = _EXPERT.search(name)
    return name[:match.start()] if match else None


def local_experts(full: dict, ep: int, rank: int, num_experts: int) -> dict:
    """Expert-parallel rank `rank`'s part of the full state: its block of num_experts / ep experts, numbered from 0
    as megatron-core's SequentialMLP numbers its local experts; every other weight whole."""
    per_rank = num_experts // ep
    out = {}
    for name, tensor in full.items():
        match = _EXPERT.search(name)
        if match is None:
            out[name] = tensor
        elif rank * per_rank <= int(match.group(1)) < (rank + 1) * per_rank:
            out[_renumbered(name, match, int(match.group(1)) - rank * per_rank)] = tensor
    return out


def global_experts(local: dict, rank: int, per_rank: int) -> dict:
    """The inverse of local_experts for one rank: its experts under their global numbers (others as they are)."""
    return {(_renumbered(name, match, int(match.group(1)) + rank * per_rank)
             if (match := _EXPERT.search(name)) else name): tensor for name, tensor in local.items()}
