"""Tensor and data parallelism of the Megatron engine over several processes.

- Weights: the full (Hugging Face-mapped) megatron state is padded to the tensor-parallel vocabulary and each rank
  keeps its shard (shards.py); a save gathers every rank's shard and unpads, so checkpoints stay plain Hugging Face
  folders whatever the degrees.
- Gradients: each data-parallel replica computes its share of the step; the gradients are summed over the
  data-parallel group (the Runner's normaliser already divides by the whole step's units, so a sum, never a mean).
- Clipping: the gradient norm counts a tensor-parallel shard on every rank that holds a piece of it, a replicated
  parameter (norms, the router) once.
Pure tensor code plus torch.distributed collectives; megatron-core's parallel state says which groups.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from .shards import padded_vocab_size, shard, unshard

_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def tp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()


def _tp() -> tuple[int, int, object]:
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_group())


def _dp() -> tuple[int, object]:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_group()


def pad_vocab(name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
    """A vocabulary-row weight padded with zero rows to the size every TP rank holds an equal part of."""
    if tp == 1 or not name.endswith(_VOCAB_ROWS):
        return tensor
    rows = padded_vocab_size(tensor.shape[0], tp)
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def local_shards(full: dict) -> dict:
    """This rank's piece of every weight of the full megatron state."""
    rank, size, _ = _tp()
    if size == 1:
        return full
    return {name: shard(name, pad_vocab(name, tensor, size), size, rank) for name, tensor in full.items()}


def gathered(local: dict, vocab_size: int) -> dict:
    """The full megatron state from every TP rank's pieces (collective: every rank calls it; all get the result),
    the vocabulary padding cut off."""
    rank, size, group = _tp()
    if size == 1:
        return local
    full = {}
    for name, tensor in local.items():
        pieces = [torch.empty_like(tensor) for _ in range(size)]
        tdist.all_gather(pieces, tensor.contiguous(), group=group)
        whole = unshard(name, pieces)
        full[name] = whole[:vocab_size] if name.endswith(_VOCAB_ROWS) else whole
    return full


class _GatherVocab(torch.autograd.Function):
    """Every TP rank's vocabulary shard of the logits, joined along the last dimension (megatron-core's own gather
    allocates on CUDA). Every rank then computes the same loss on the whole logits, so the backward keeps this
    rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, logits):
        rank, size, group = _tp()
        pieces = [torch.empty_like(logits) for _ in range(size)]
        tdist.all_gather(pieces, logits.contiguous(), group=group)
        ctx.rank, ctx.width = rank, logits.shape[-1]
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous()


def gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """The whole vocabulary's logits from this rank's shard (the logits themselves without tensor parallelism)."""
    return _GatherVocab.apply(logits) if tp_size() > 1 else logits


def sum_gradients_over_data_parallel(params: list) -> None:
    """Each gradient summed over the data-parallel replicas, one flat all-reduce per dtype and device."""
    size, group = _dp()
    if size > 1:
        _all_reduce_flat(params, group)


def sum_head_norm_gradients_over_tensor_parallel(model) -> None:
    """Qwen3's per-head query/key norms are whole on every TP rank, but each rank normalises only its own heads:
    their gradients are partial sums, added over the TP group (as megatron-core's finalize_model_grads does)."""
    _, size, group = _tp()
    if size > 1:
        _all_reduce_flat([p for name, p in model.named_parameters()
                          if p.requires_grad and ("q_layernorm" in name or "k_layernorm" in name)], group)


def _all_reduce_flat(params: list, group) -> None:
    buckets: dict = {}
    for p in params:
        if p.grad is not None:
            buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        tdist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def is_sharded(param) -> bool:
    """A tensor-parallel piece (megatron-core marks them); a replicated parameter is whole on every rank."""
    return bool(getattr(param, "tensor_model_parallel", False))


def total_grad_norm(params: list) -> torch.Tensor:
    """The L2 norm of the whole model's gradient: the shards' squares summed over the TP group, the replicated
    parameters' counted once."""
    grads = [(p.grad, is_sharded(p)) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    device = grads[0][0].device
    sharded = sum((g.float().pow(2).sum() for g, split in grads if split), torch.zeros((), device=device))
    replicated = sum((g.float().pow(2).sum() for g, split in grads if not split), torch.zeros((), device=device))
    _, size, group = _tp()
    if size > 1:
        tdist.all_reduce(sharded, group=group)
    return (sharded + replicated).sqrt()
