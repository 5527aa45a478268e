"""One forward of a megatron-core GPTModel on a collated batch, outputs as models/forward.py's.

Packed rows keep their samples apart in attention (attention.py): on CUDA in half precision by the
collator's sample boundaries (cu_seqlens) for PyTorch's variable-length FlashAttention, elsewhere by a
block-diagonal causal mask built from the segment ids (True = masked); and by per-sample rotary
angles (rotary.py); a vision-language model's media features enter on the first stage (vision.py). The pieces of GPTModel are called in its own order — embedding, decoder
(its last norm included), output layer — so that the angles can be passed in; a pipeline stage
without the embedding or the head runs only the part it holds.
"""

from __future__ import annotations

import torch

from ...errors import TunesmithError
from ...models.attention import varlen_available
from ...models.forward import ModelOutputs, last_token_index
from .context_parallel import context_mask, local_part, varlen_plan, whole_sequence
from .fused import cos_sin, rope_available
from .sequence_parallel import gathered, scattered
from .vision import deepstack_added, merged_embeddings


def packed_causal_mask(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool, True where a query must not see a key: another sample or a later token. A row's padding
    (segment -1, one run at its end) is a causal segment of its own, as in the collator's cu_seqlens and in
    transformers' packed masks from the position ids: its hidden states never reach a loss, except through a
    mixture-of-experts model's router statistics, which count every position on every engine."""
    same_BTT = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    length = segment_ids_BT.shape[1]
    causal_TT = torch.ones(length, length, dtype=torch.bool, device=segment_ids_BT.device).tril()
    return ~(same_BTT & causal_TT)[:, None]


def varlen_fits(device: torch.device, dtype: torch.dtype, has_boundaries: bool) -> bool:
    """Whether attention runs PyTorch's variable-length FlashAttention: CUDA, bf16/fp16 compute and the batch's
    sample boundaries (collate_rows gives every batch them); otherwise SDPA with the packed mask."""
    return has_boundaries and dtype in (torch.bfloat16, torch.float16) and varlen_available(device)


def compute_dtype(model) -> torch.dtype:
    """The dtype the matmuls run in: autocast's on CUDA, else the weights' (pure_bf16: bf16)."""
    if torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return next(model.parameters()).dtype


def attention_inputs(model, batch) -> dict:
    """The decoder's attention keyword arguments for this batch: the boundaries as megatron-core's PackedSeqParams
    (`sbhd`: the rows keep their layout, so megatron-core's rotary and layers treat them as unpacked) for the
    varlen kernel, or the dense mask for SDPA."""
    if not varlen_fits(batch.input_ids_BT.device, compute_dtype(model), batch.cu_seqlens is not None):
        return {"attention_mask": packed_causal_mask(batch.segment_ids_BT)}
    return {"attention_mask": None, "packed_seq_params": packed_seq_params(batch)}


def context_attention_inputs(model, batch) -> dict:
    """Under context parallelism: this rank's FlashAttention segments (context_parallel.varlen_plan) carried by a
    `sbhd` PackedSeqParams, or SDPA's mask where the kernel does not fit (CPU, fp32)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    device = batch.input_ids_BT.device
    if not varlen_fits(device, compute_dtype(model), True):
        return {"attention_mask": context_mask(batch.segment_ids_BT)}
    plan = varlen_plan(batch.segment_ids_BT, device)
    params = PackedSeqParams(qkv_format="sbhd", cu_seqlens_q=plan.cu_seqlens_q, cu_seqlens_kv=plan.cu_seqlens_k,
                             max_seqlen_q=plan.max_seqlen_q, max_seqlen_kv=plan.max_seqlen_k)
    params.context_keys = plan.key_index  # read by attention.PackedCoreAttention
    return {"attention_mask": None, "packed_seq_params": params}


def packed_seq_params(batch):
    """The collator's boundaries (every sample and padding run of the flattened batch, row after row) as
    megatron-core's PackedSeqParams, on the batch's device."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu_seqlens = batch.cu_seqlens.to(device=batch.input_ids_BT.device, dtype=torch.int32)
    return PackedSeqParams(qkv_format="sbhd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=int(batch.max_seqlen), max_seqlen_kv=int(batch.max_seqlen))


def padding_lookups_untrained(hidden_TBH: torch.Tensor, input_ids_BT: torch.Tensor, padding_idx: int | None):
    """nn.Embedding's padding_idx rule, which transformers' embeddings follow (padding_idx = pad_token_id): a lookup
    of the padding id gives its row no gradient. megatron-core's embedding has no padding_idx (the engine sets
    `model.padding_idx` from the Hugging Face embedding). It matters where a padding position reaches a loss: a
    mixture-of-experts model's router statistics count every position, and a pad id inside a sample."""
    if padding_idx is None or not hidden_TBH.requires_grad:
        return hidden_TBH
    lookup_TB1 = (input_ids_BT == padding_idx).transpose(0, 1)[..., None]
    return torch.where(lookup_TB1, hidden_TBH.detach(), hidden_TBH)


def _decoder(model, batch, angles) -> torch.Tensor:
    """The decoder's output [T, B, H] (its final norm included on the last stage); under context parallelism this
    rank's tokens of it (context_parallel.py)."""
    split = model.config.context_parallel_size > 1
    attention = context_attention_inputs(model, batch) if split else attention_inputs(model, batch)
    rows = batch.input_ids_BT.shape[0] if one_row_fits(model, attention) else 1
    rotary = angles.for_batch(batch)
    rotary = local_part(rotary, 0) if split else as_one_row(rotary, rows)
    if not split and "packed_seq_params" in attention and rope_available():
        attention["packed_seq_params"].rotary = cos_sin(rotary)  # rotated in the core attention (fused.py)
        rotary = None
    hidden, deepstack = None, None
    if model.pre_process:
        hidden = model.embedding(input_ids=batch.input_ids_BT, position_ids=batch.position_ids_BT)
        hidden = padding_lookups_untrained(hidden, batch.input_ids_BT, getattr(model, "padding_idx", None))
        hidden, deepstack = merged_embeddings(model, batch, hidden)  # a vision-language model's media features
        if split:  # this rank's tokens of the row
            hidden = local_part(hidden, 0)
            deepstack = deepstack and [local_part(extra, 0) for extra in deepstack]
        if model.config.sequence_parallel:  # this rank's block of the sequence (sequence_parallel.py)
            hidden = scattered(hidden)
            deepstack = deepstack and [scattered(extra) for extra in deepstack]
        hidden = as_one_row(hidden, rows)
        deepstack = deepstack and [as_one_row(extra, rows) for extra in deepstack]
    with deepstack_added(model, deepstack):
        out = model.decoder(hidden_states=hidden, rotary_pos_emb=rotary, **attention)
    if rows > 1:  # back to [T, B, H]: a view (the fused head reads it batch-major, as it is stored)
        return out.view(rows, -1, out.shape[-1]).transpose(0, 1)
    return out


def one_row_fits(model, attention: dict) -> bool:
    """Whether the decoder runs the batch's rows as one row: on the variable-length FlashAttention path (the
    boundaries, cu_seqlens over the flattened batch, keep the samples apart; rotary angles and everything else act
    per token) in one pipeline stage, without sequence or context parallelism. megatron-core's [T, B, H] layout
    then needs no transposes around the attention and RoPE kernels, which read and write [B, T, .]."""
    config = model.config
    return ("packed_seq_params" in attention and config.pipeline_model_parallel_size == 1
            and not config.sequence_parallel and config.context_parallel_size == 1)


def as_one_row(tensor_TB: torch.Tensor, rows: int) -> torch.Tensor:
    """[T, B, ...] -> [B x T, 1, ...], row after row (the order of the collator's cu_seqlens), where rows > 1."""
    if rows == 1:
        return tensor_TB
    return tensor_TB.transpose(0, 1).reshape(-1, 1, *tensor_TB.shape[2:])


def lm_forward(model, batch, angles, kind: str = "logits") -> torch.Tensor:
    """Logits [B, T, V] on the last pipeline stage (for "nll" where the fused head fits: the NLL summed over the
    batch's label tokens, a 0-d tensor), else the hidden states [T, B, H] for the next one."""
    hidden = _decoder(model, batch, angles)
    if not model.post_process:
        return hidden
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    if kind == "nll" and fused_head_fits(model):
        return fused_nll_sum(model, hidden, weight, batch)
    logits_TBV, _ = model.output_layer(hidden, weight=weight)
    return logits_TBV.transpose(0, 1)


def fused_head_fits(model) -> bool:
    """Whether the output layer and its cross-entropy run as models/linear_ce.py's fused head: the whole vocabulary
    on this rank (no tensor parallelism) and the whole rows' tokens (no context parallelism)."""
    config = model.config
    return config.tensor_model_parallel_size == 1 and config.context_parallel_size == 1


def fused_nll_sum(model, hidden_TBH: torch.Tensor, weight: torch.Tensor | None, batch) -> torch.Tensor:
    """The NLL summed over the batch's label tokens, from the decoder's output through the output layer's weight
    (without tensor parallelism the vocabulary is not padded) in chunks, never holding the whole logits
    (models/linear_ce.py; the single engine's fused head)."""
    from ...models.linear_ce import linear_cross_entropy_sum

    weight = model.output_layer.weight if weight is None else weight
    hidden = hidden_TBH.transpose(0, 1).reshape(-1, hidden_TBH.shape[-1])  # [B x T, H] in the batch's row order
    return linear_cross_entropy_sum(hidden, weight, batch.targets_BT.reshape(-1), batch.counted_rows)


def reward_forward(model, batch, angles) -> torch.Tensor:
    """A reward model's scalar per row [B]: the score head at the row's last real token (models/forward.py's
    sequence_rewards), or the hidden states for the next pipeline stage. The head scores every token, as
    transformers' sequence classifier does; under context parallelism this rank's tokens, whose scores are then made
    the whole rows' (so the head's gradient comes from this rank's tokens only, as every other weight's)."""
    hidden = _decoder(model, batch, angles)
    if not model.post_process:
        return hidden
    hidden = gathered(hidden) if model.config.sequence_parallel else hidden
    scores_TB = model.score(hidden).squeeze(-1)
    scores_TB = whole_sequence(scores_TB, 0) if model.config.context_parallel_size > 1 else scores_TB
    last = last_token_index(batch.segment_ids_BT)
    return scores_TB[last, torch.arange(scores_TB.shape[1], device=scores_TB.device)].float()


def stage_forward(model, batch, kind: str, angles) -> torch.Tensor:
    """The tensor the micro-batch schedule carries: rewards for "rewards", else logits, or for "nll" the fused
    head's NLL sum where it fits (fused_head_fits)."""
    if kind == "rewards":
        if model.post_process and getattr(model, "score", None) is None:  # the head is the last stage's
            raise TunesmithError("reward outputs need the reward model's score head (stage rm)")
        return reward_forward(model, batch, angles)
    return lm_forward(model, batch, angles, kind)


def as_outputs(tensor: torch.Tensor, kind: str, model, batch) -> ModelOutputs:
    """The last stage's tensor as the outputs a method expects on every engine; a tensor-parallel output layer's
    logits (a block of the vocabulary per rank) become the summed NLL ("nll") or the gathered logits
    (vocab_parallel.py); under context parallelism "nll" stays this rank's tokens' (`batch` is their part) and
    logits become the whole rows'."""
    if kind == "rewards":
        return ModelOutputs(rewards_B=tensor)
    if kind == "nll" and tensor.dim() == 0:  # the fused head's NLL sum (lm_forward)
        return ModelOutputs(nll_sum=tensor)
    if model.config.tensor_model_parallel_size > 1:
        from .vocab_parallel import gathered_logits, vocab_parallel_nll

        if kind == "nll":
            return ModelOutputs(nll_sum=vocab_parallel_nll(tensor, batch.targets_BT, model.hf_vocab_size).sum())
        tensor = gathered_logits(tensor, model.hf_vocab_size)
    if kind != "nll" and model.config.context_parallel_size > 1:  # the whole rows' logits (context_parallel.py)
        tensor = whole_sequence(tensor, 1)
    return ModelOutputs(logits_BTV=tensor)

