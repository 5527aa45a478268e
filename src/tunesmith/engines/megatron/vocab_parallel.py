"""The output of a tensor-parallel output layer: each rank holds the logits of its block of the (padded)
vocabulary, [B, T, V_padded / TP]. Methods get what they get on every engine:
  - "nll" (sft, pt): the NLL summed over the label tokens, computed without gathering the vocabulary
    (megatron-core's vocab_parallel_cross_entropy: the softmax's max and sum all-reduced over the group);
  - "logits" (dpo, kto, log-probs): the full logits [B, T, V], gathered, the padding cut off.
The padding's logits (zero weights) are masked out of the softmax, so the numbers are those of the unpadded
vocabulary.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from ...data.collate import IGNORE_INDEX


def _group():
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def _padding_masked(logits_BTv: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """This rank's logits with the padding rows' columns at -inf (no weight in the softmax, no gradient)."""
    local = logits_BTv.shape[-1]
    start = tdist.get_rank(_group()) * local
    if start + local <= vocab_size:
        return logits_BTv
    padding_v = torch.arange(start, start + local, device=logits_BTv.device) >= vocab_size
    return logits_BTv.masked_fill(padding_v, float("-inf"))


def vocab_parallel_nll(logits_BTv: torch.Tensor, targets_BT: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per-token NLL [B, T] in fp32 over the whole vocabulary, 0 where the target is IGNORE_INDEX (as
    methods/losses.token_nll)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # fp32, contiguous (it views the rows flat) and a copy of its own: megatron-core's function works in place
    logits_BTv = _padding_masked(logits_BTv, vocab_size).to(torch.float32, memory_format=torch.contiguous_format,
                                                           copy=True)
    labelled_BT = targets_BT != IGNORE_INDEX
    nll_BT = vocab_parallel_cross_entropy(logits_BTv, targets_BT.masked_fill(~labelled_BT, 0))
    return nll_BT * labelled_BT


class _GatherVocabulary(torch.autograd.Function):
    """All-gather along the last dimension; backward: this rank's block of the gradient. (megatron-core's
    gather_from_tensor_model_parallel_region allocates on CUDA.)"""

    @staticmethod
    def forward(ctx, logits_BTv):
        group = _group()
        ctx.rank, ctx.local = tdist.get_rank(group), logits_BTv.shape[-1]
        pieces = [torch.empty_like(logits_BTv) for _ in range(tdist.get_world_size(group))]
        tdist.all_gather(pieces, logits_BTv.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad_BTV):
        return grad_BTV[..., ctx.rank * ctx.local:(ctx.rank + 1) * ctx.local].contiguous()


def gathered_logits(logits_BTv: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The full logits [B, T, vocab_size] on every rank of the tensor-parallel group."""
    return _GatherVocabulary.apply(logits_BTv)[..., :vocab_size]
