"""sequence_parallel: true — under tensor parallelism, the residual stream (norms, residual adds) held as a block
of the sequence per tensor-parallel rank, as megatron-core shards it: its ColumnParallelLinear gathers the
sequence before the attention and the MLP, its RowParallelLinear reduce-scatters their outputs, and its output
layer gathers the last hidden states. Activation memory outside attention and the MLP drops by the degree; the
numbers are tensor parallelism's.

What the engine adds around megatron-core's layers:
- `LocalNorm` / `SequenceNorm` / `PreNorm`: the local layer spec's norm (torch's RMSNorm, as megatron-core's
  WrappedTorchNorm builds it, which refuses sequence parallelism; fused.py's kernels on CUDA). A norm applied to
  the sequence block (`SequenceNorm`, `PreNorm`: the layers' input and pre-MLP norms, the final norm) gets a
  partial gradient on each rank: its weight is marked `sequence_parallel` and parallel.sum_partial_replicas sums
  it over the tensor-parallel group, as megatron-core's finalize_model_grads does;
- `padded_rows`: each row padded to a multiple of the tensor-parallel degree (the padding is a segment of its
  own with ignored targets, as the collator's padding: it reaches no loss);
- `scattered` / `gathered`: the decoder input split along the sequence once the embeddings and a vision-language
  model's media features are in place (forward.py), a reward head's hidden states gathered back.
"""

from __future__ import annotations

import dataclasses

import torch

from ...data.collate import IGNORE_INDEX
from .fused import FusedRMSNorm


class LocalNorm:
    """An RMSNorm(hidden_size, eps) for a megatron-core module spec: the local spec's torch.nn.RMSNorm (fp32
    weight), with fused.py's kernels on CUDA."""

    half_output = False

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        return FusedRMSNorm(hidden_size, eps, half_output=cls.half_output)


class SequenceNorm(LocalNorm):
    """A LocalNorm applied to the sequence block: under sequence parallelism its weight's gradient is summed over
    the tensor-parallel group (module docstring)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        norm = super().__new__(cls, config, hidden_size, eps)
        norm.weight.sequence_parallel = bool(config.sequence_parallel)
        return norm


class PreNorm(SequenceNorm):
    """A layer's input or pre-MLP norm: a SequenceNorm whose output only linears read (fused.FusedRMSNorm's
    half_output)."""

    half_output = True


def padded_rows(batch, multiple: int, pad_id: int):
    """`batch` (an SFTBatch) with each row padded at its end to a multiple of `multiple` tokens: pad_id, ignored
    targets, a padding segment (-1) whose positions count on (joined to the row's own padding run, if it ends
    with one), text token type. Per-row fields (extra, media) are unchanged."""
    rows, width = batch.input_ids_BT.shape
    more = -width % multiple
    if not more:
        return batch

    def extended(tensor_BT, value):
        return torch.cat([tensor_BT, tensor_BT.new_full((rows, more), value)], dim=1)

    positions = batch.position_ids_BT
    ends_padded = batch.segment_ids_BT[:, -1:] < 0
    start = torch.where(ends_padded, positions[:, -1:] + 1, torch.zeros_like(positions[:, -1:]))
    tail = start + torch.arange(more, device=positions.device)
    segments = extended(batch.segment_ids_BT, -1)
    return dataclasses.replace(
        batch, input_ids_BT=extended(batch.input_ids_BT, pad_id), targets_BT=extended(batch.targets_BT, IGNORE_INDEX),
        position_ids_BT=torch.cat([positions, tail], dim=1), segment_ids_BT=segments,
        token_types_BT=None if batch.token_types_BT is None else extended(batch.token_types_BT, 0),
        cu_seqlens=None if batch.cu_seqlens is None else _boundaries(segments),
        max_seqlen=int(_run_lengths(segments).max()) if batch.cu_seqlens is not None else batch.max_seqlen,
        counted_rows=None)


def _run_lengths(segments_BT: torch.Tensor) -> torch.Tensor:
    """The lengths of the runs of equal segment ids, row after row (a row's samples and its padding run)."""
    lengths = [torch.unique_consecutive(row, return_counts=True)[1] for row in segments_BT]
    return torch.cat(lengths)


def _boundaries(segments_BT: torch.Tensor) -> torch.Tensor:
    """The collator's cu_seqlens (int32, from 0) of these segments."""
    lengths = _run_lengths(segments_BT).to(torch.int32)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0, dtype=torch.int32)])


def scattered(hidden_TBH: torch.Tensor) -> torch.Tensor:
    """This tensor-parallel rank's block of the sequence (the gradient gathered back in the backward)."""
    from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

    return scatter_to_sequence_parallel_region(hidden_TBH)


def gathered(hidden_TBH: torch.Tensor) -> torch.Tensor:
    """The whole sequence from every rank's block, for a head every rank applies alike (the backward takes this
    rank's block of the gradient, not a sum over ranks)."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden_TBH, tensor_parallel_output_grad=False)
