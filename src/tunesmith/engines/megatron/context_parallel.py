"""context_parallel_size: each row's sequence split over the context-parallel ranks, with torch-native attention
(megatron-core's own context parallelism runs only through Transformer Engine's attention).

Each of the CP ranks holds two of the row's 2 x CP equal blocks: block r and block 2 x CP - 1 - r, megatron-core's
load balancing (under a causal mask a late block attends to more keys than an early one). Per rank:
- the embeddings, a vision-language model's media features and the rotary angles are computed for the whole row
  and cut to this rank's blocks (forward.py);
- each attention layer gathers every rank's keys and values (their gradients summed back to the rank that made
  them) and lets this rank's queries see the keys of their own sample at or before their position. On CUDA in
  bf16/fp16 through PyTorch's variable-length FlashAttention (`varlen_plan`): each piece of a sample inside one of
  this rank's blocks is a query segment whose keys are its sample's from the sample's start to the piece's end
  (FlashAttention aligns the causal mask to the keys' end), so only those blocks are computed, no mask is built and
  the early block's rank does less work than the late one's. Elsewhere (CPU, fp32) a mask from the row's segment
  ids (`context_mask`) for PyTorch's SDPA;
- the rest (norms, MLP, output layer) is per token, on this rank's tokens;
- a loss that is a sum over tokens (pt, sft: `splits_loss`) is computed by each rank over its tokens, normalised
  by the step's label tokens (the whole rows'), so the ranks' losses add up to the step loss
  (`summed_over_context`); any other loss (a sequence's log-probability, a reward at the last token) reads the
  whole rows' logits or token scores (`whole_sequence`), the same on every rank, each rank taking back the
  gradient of its own tokens.
Either way the ranks' gradients, summed with the data-parallel ranks' (parallel.replica_group), are the step's.
The context-parallel ranks of one data-parallel replica read the same rows (parallel.register_data_parallel).

Activations per rank drop by the degree, except attention's gathered keys and values (under SDPA also its
[B, T / CP, T] mask; under FlashAttention the keys each piece reads, at most about 1.5 x a row's), and the whole
rows' logits where a loss reads them. A mixture-of-experts model's router loss reads every rank's
router logits (`router_loss_share`).
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


@dataclasses.dataclass
class VarlenPlan:
    """This rank's queries and the gathered keys as FlashAttention's variable-length segments: queries in the local
    layout flattened row after row ([B x T / CP]), keys picked from the gathered keys flattened as [T x B]
    (`key_index`, sequence-major, as gathered_sequence returns them)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    key_index: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def varlen_plan(segment_ids_BT: torch.Tensor, device: torch.device) -> VarlenPlan:
    """The segments for `segment_ids_BT` (the whole rows'; a row's padding run is a sample of its own, as in
    context_mask); one host read of the ids per forward."""
    size, rank = cp_size(), cp_rank()
    ids = segment_ids_BT.cpu()
    rows, length = ids.shape
    positions = block_positions(length, size)
    gathered_at = torch.empty(length, dtype=torch.long)
    gathered_at[positions.flatten()] = torch.arange(length)  # a row position -> its index among the gathered keys
    block = length // (2 * size)
    starts_T = torch.ones(rows, length, dtype=torch.bool)
    starts_T[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first_T = torch.where(starts_T, torch.arange(length), 0).cummax(dim=1).values  # each token's sample start
    q_lengths, k_lengths, keys = [], [], []
    for row in range(rows):
        for first in (rank * block, (2 * size - 1 - rank) * block):
            cuts = [first, *(first + torch.nonzero(starts_T[row, first + 1:first + block]).flatten() + 1).tolist(),
                    first + block]
            for start, end in zip(cuts[:-1], cuts[1:]):
                sample_start = int(first_T[row, start])
                q_lengths.append(end - start)
                k_lengths.append(end - sample_start)
                keys.append(gathered_at[sample_start:end] * rows + row)

    def cumulative(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)

    return VarlenPlan(cumulative(q_lengths), cumulative(k_lengths), torch.cat(keys).to(device), max(q_lengths),
                      max(k_lengths))


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


class _WholeSequence(torch.autograd.Function):
    """Every context-parallel rank's tokens of a tensor put back in the row's order along `dim`; backward: this rank's
    tokens of the gradient (every rank computes the same function of the whole, so each keeps its own part)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        group = _state().get_context_parallel_group()
        pieces = [torch.empty_like(tensor) for _ in range(tdist.get_world_size(group))]
        tdist.all_gather(pieces, tensor.contiguous(), group=group)
        ranked = torch.cat(pieces, dim=dim)
        blocks = block_positions(ranked.shape[dim], len(pieces)).to(ranked.device)
        ctx.dim, ctx.mine = dim, blocks[cp_rank()]
        return ranked.index_select(dim, torch.argsort(blocks.flatten()))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.index_select(ctx.dim, ctx.mine), None


def whole_sequence(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's tokens of `tensor` along `dim` -> the whole row's, in order (context_parallel.py's module
    docstring: outputs a loss reads as a whole, logits for a sequence's log-probability, a reward head's hidden
    states)."""
    return _WholeSequence.apply(tensor, dim)


def gathered_sequence(tensor_TX: torch.Tensor) -> torch.Tensor:
    """Keys or values [T / CP, ...] of every context-parallel rank -> [T, ...] (context_mask's key order)."""
    return _GatheredSequence.apply(tensor_TX)


def router_loss_share(loss_of, layers: list) -> torch.Tensor:
    """transformers' router load-balancing loss, `loss_of(layers)`, over every context-parallel rank's tokens: each
    layer's router logits [tokens, experts] gathered (the loss reads them as a set of tokens: their order does not
    matter) and the loss divided by the degree, since every rank computes it and the ranks' losses are summed; the
    gather sums the ranks' gradients back, so each rank's logits get the whole loss's gradient."""
    if cp_size() == 1:
        return loss_of(layers)
    return loss_of([gathered_sequence(logits) for logits in layers]) / cp_size()


def splits_loss(kind: str) -> bool:
    """Whether each context-parallel rank computes its tokens' share of the loss (a sum over tokens: "nll", which
    methods read with the targets); otherwise the outputs are made whole first (whole_sequence) and every rank
    computes the same loss of them."""
    return kind == "nll" and cp_size() > 1


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
