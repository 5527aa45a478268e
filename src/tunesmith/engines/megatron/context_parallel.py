"""context_parallel_size: each row's sequence split over the context-parallel ranks, with torch-native attention
(megatron-core's own context parallelism runs only through Transformer Engine's attention).

Each of the CP ranks holds two of the row's 2 x CP equal blocks: block r and block 2 x CP - 1 - r, megatron-core's
load balancing (under a causal mask a late block attends to more keys than an early one). Per rank:
- the embeddings, a vision-language model's media features and the rotary angles are computed for the whole row
  and cut to this rank's blocks (forward.py);
- each attention layer gathers every rank's keys and values (their gradients summed back to the rank that made
  them) and lets this rank's queries see the keys of their own sample at or before their position: a mask from the
  row's segment ids (`context_mask`) for PyTorch's SDPA, on every device;
- the rest (norms, MLP, output layer, the loss) is per token, on this rank's tokens.
Each rank's loss sums its tokens' NLL over the step's label tokens (the whole rows'), so the context-parallel ranks'
losses add up to the step loss (`summed_over_context`) and their gradients, summed with the data-parallel ranks'
(parallel.replica_group), to the step's gradient. The context-parallel ranks of one data-parallel replica read the
same rows (parallel.register_data_parallel).

Activations per rank drop by the degree, except attention's gathered keys and values and its [B, T / CP, T] mask.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as tdist


def _state():
    from megatron.core import parallel_state

    return parallel_state


def cp_size() -> int:
    return _state().get_context_parallel_world_size()


def cp_rank() -> int:
    return _state().get_context_parallel_rank()


def block_positions(length: int, size: int) -> torch.Tensor:
    """[size, length // size]: the token positions each of `size` ranks holds, blocks r and 2 x size - 1 - r of a
    row of `length` tokens (a multiple of 2 x size) cut into 2 x size blocks."""
    blocks = torch.arange(length).view(2 * size, length // (2 * size))
    return torch.stack([torch.cat([blocks[r], blocks[2 * size - 1 - r]]) for r in range(size)])


def local_part(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's tokens of `tensor`, whose dimension `dim` is the whole row's sequence (its gradient flows back to
    those positions only)."""
    positions = block_positions(tensor.shape[dim], cp_size())[cp_rank()]
    return tensor.index_select(dim, positions.to(tensor.device))


def local_batch(batch):
    """The per-token fields a loss reads (targets, segment ids) cut to this rank's tokens; the counts (label tokens)
    stay the whole rows'."""
    cut = {name: local_part(getattr(batch, name), 1) for name in ("targets_BT", "segment_ids_BT", "position_ids_BT")}
    return dataclasses.replace(batch, **cut)


def context_mask(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """[B, 1, T / CP, T] bool, True where one of this rank's queries must not see a key: the keys in the order the
    attention gathers them (rank after rank, each rank's blocks in order), masked when of another sample (a row's
    padding run is a sample of its own, as in forward.packed_causal_mask) or later in the row."""
    positions = block_positions(segment_ids_BT.shape[1], cp_size()).to(segment_ids_BT.device)
    queries, keys = positions[cp_rank()], positions.flatten()
    same_BQK = segment_ids_BT[:, queries, None] == segment_ids_BT[:, None, keys]
    return ~(same_BQK & (keys[None, :] <= queries[:, None]))[:, None]


class _GatheredSequence(torch.autograd.Function):
    """Every context-parallel rank's tensor, concatenated along dim 0 in rank order; backward: the gradient of this
    rank's part, summed over the ranks (each rank's queries used it)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        group = _state().get_context_parallel_group()
        pieces = [torch.empty_like(tensor) for _ in range(tdist.get_world_size(group))]
        tdist.all_gather(pieces, tensor.contiguous(), group=group)
        ctx.length = tensor.shape[0]
        return torch.cat(pieces, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        group = _state().get_context_parallel_group()
        grad = grad.contiguous()
        if tdist.get_backend(group) == "nccl":
            mine = grad.new_empty((ctx.length, *grad.shape[1:]))
            tdist.reduce_scatter_tensor(mine, grad, group=group)
            return mine
        tdist.all_reduce(grad, group=group)  # gloo has no reduce-scatter of one tensor
        start = tdist.get_rank(group) * ctx.length
        return grad[start:start + ctx.length].clone()


def gathered_sequence(tensor_TX: torch.Tensor) -> torch.Tensor:
    """Keys or values [T / CP, ...] of every context-parallel rank -> [T, ...] (context_mask's key order)."""
    return _GatheredSequence.apply(tensor_TX)


def summed_over_context(out, device: torch.device):
    """`out` (a StepOutput, or a method's LossOutput) with its loss and metric sums summed over the context-parallel
    ranks (each holds its tokens' share); `*_max` sums take the largest. The unit count is the whole rows' on every
    rank and stays."""
    if cp_size() == 1:
        return out
    group = _state().get_context_parallel_group()
    keys = sorted(out.sums)
    values = torch.stack([torch.as_tensor(v, device=device).detach().double().reshape(())
                          for v in (out.loss, *(out.sums[k] for k in keys))])
    summed, top = values.clone(), values.clone()
    tdist.all_reduce(summed, group=group)
    tdist.all_reduce(top, op=tdist.ReduceOp.MAX, group=group)
    out.loss = summed[0]
    out.sums = {k: (top if k.endswith("_max") else summed)[i + 1] for i, k in enumerate(keys)}
    return out
