"""Variable-length flash attention for packed rows, without the flash-attn package.

A packed row holds several samples end to end. SDPA needs a [B, 1, T, T] block-diagonal
mask for it and then runs the (slower) memory-efficient kernel; PyTorch's own FlashAttention-2
port (`aten::_flash_attention_forward`, CUDA, bf16/fp16, with autograd) takes the sample
boundaries directly (`cu_seqlens`), needs no mask, and computes only the blocks inside each
sample.

The collator already knows every boundary (`SFTBatch.cu_seqlens`), so the forward receives
them as keyword arguments (`packed_cu_seqlens`, `packed_max_seqlen`) that transformers passes
down to each attention call, under gradient checkpointing too. Without them (generation with a
padding mask and a KV cache, or non-causal vision-tower attention) this implementation is
plain SDPA, so one model serves training, evaluation and rollouts.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from .flash_impl import fa4_on, fa4_varlen

VARLEN = "tunesmith_varlen"
# A Qwen-VL vision tower hands its images' boundaries (cu_seqlens) only to an implementation whose name says
# "flash"; any other gets one SDPA call per image in every layer, after a host synchronisation.
VISION_VARLEN = "tunesmith_flash_vision"
_registered = False
_boundaries_given = contextvars.ContextVar("tunesmith_boundaries_given", default=False)


def varlen_available(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch.ops.aten, "_flash_attention_forward")


def register() -> str:
    """Make `attn_implementation="tunesmith_varlen"` known to transformers (once per process)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(VARLEN, varlen_attention)
        AttentionInterface.register(VISION_VARLEN, vision_varlen_attention)
        AttentionMaskInterface.register(VARLEN, _padding_mask_only)
        _skip_packed_search_when_given()
        _registered = True
    return VARLEN


@contextlib.contextmanager
def boundaries_given():
    """Inside it, the model's forward gets each sample's boundaries (packed_cu_seqlens): transformers' search for
    packed samples in the position ids, which reads a GPU value on the host and so makes the host wait for the
    GPU at every forward, is skipped (the varlen attention builds no mask from it)."""
    token = _boundaries_given.set(True)
    try:
        yield
    finally:
        _boundaries_given.reset(token)


def _skip_packed_search_when_given() -> None:
    from transformers import masking_utils

    search = getattr(masking_utils, "find_packed_sequence_indices", None)
    if search is None:  # a transformers release without the search has nothing to skip
        return

    def find_packed_sequence_indices(position_ids, *args, **kwargs):
        return None if _boundaries_given.get() else search(position_ids, *args, **kwargs)

    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices


def _padding_mask_only(*args, attention_mask=None, **kwargs):
    """Training passes no padding mask (boundaries come as cu_seqlens): build nothing. Generation
    passes one: build SDPA's mask for the SDPA fallback."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     packed_cu_seqlens=None, packed_max_seqlen=None, **kwargs):
    """transformers attention signature: query [B, H, T, D], key/value [B, Hkv, T, D] -> ([B, T, H, D], None)."""
    if packed_cu_seqlens is None or not getattr(module, "is_causal", True) or query.device.type != "cuda":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, length, dim = query.shape
    q, k, v = (t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value))
    out = flash_varlen(q, k, v, packed_cu_seqlens, packed_max_seqlen, dropout=dropout if module.training else 0.0,
                       scale=scaling)
    return out.view(batch, length, heads, dim), None


def flash_varlen(q_NHD: torch.Tensor, k_NHD: torch.Tensor, v_NHD: torch.Tensor, cu_seqlens: torch.Tensor,
                 max_seqlen: int, *, dropout: float = 0.0, scale: float | None = None,
                 cu_seqlens_k: torch.Tensor | None = None, max_seqlen_k: int | None = None,
                 causal: bool = True) -> torch.Tensor:
    """FlashAttention within each segment of the flattened batch (N = B x T tokens, row after row), causal unless
    told otherwise: q [N, H, D], k/v [N, Hkv, D] (grouped-query heads are not repeated), cu_seqlens [segments + 1]
    int32 -> [N, H, D] in FlashAttention's half dtype. CUDA only (varlen_available). With `cu_seqlens_k` the keys'
    segments differ from the queries' (k/v [Nk, Hkv, D]); the causal mask is aligned to each segment's last key, as
    FlashAttention 2 does. PyTorch's FlashAttention-2 kernel, or FlashAttention 4 when flash_impl switched it on
    (models/flash_impl.py; without dropout, which it does not have)."""
    dtype = _half_dtype(v_NHD)
    q, k, v = (t.to(dtype) for t in (q_NHD, k_NHD, v_NHD))
    cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    longest_k = max_seqlen if max_seqlen_k is None else max_seqlen_k
    if fa4_on(dropout):
        out = fa4_varlen(q, k, v, cu_seqlens, cu_k, max_seqlen, longest_k, scale, causal)
        if out is not None:
            return out
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_k, max_seqlen, longest_k, dropout,
                                                   causal, False, scale=scale)[0]


def use_varlen_in_vision_tower(tower: torch.nn.Module) -> None:
    """Let a Qwen-VL vision tower attend within each image through one variable-length FlashAttention call a
    layer (non-causal), as it does with the flash-attn package."""
    register()
    tower.config._attn_implementation = VISION_VARLEN


def vision_varlen_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0, scaling=None,
                            cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """Non-causal attention within each image: query/key/value [1, H, N, D] over every patch of the forward,
    cu_seq_lens_q the images' boundaries -> ([1, N, H, D], None). Off CUDA, and in fp32 outside autocast (a
    rollout's `generate` on fp32 master weights), one SDPA call per image in the inputs' dtype."""
    if cu_seq_lens_q is None:
        raise ValueError("vision_varlen_attention needs the images' boundaries (cu_seq_lens_q)")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, H, D]
    full_precision = query.dtype == torch.float32 and not torch.is_autocast_enabled("cuda")
    if query.device.type != "cuda" or full_precision:
        return _attention_per_segment(q, k, v, cu_seq_lens_q, scaling), None
    cu = cu_seq_lens_q.to(torch.int32)
    out = flash_varlen(q, k, v, cu, _longest(cu, max_length_q), dropout=dropout, scale=scaling, causal=False)
    return out.unsqueeze(0), None


_last_longest: tuple = (None, 0)  # (the cu_seqlens tensor, its longest segment): every layer of a pass shares it


def _longest(cu_seqlens: torch.Tensor, given) -> int:
    """The longest segment as a Python int, read from the GPU once per tensor (not once per layer)."""
    global _last_longest
    if isinstance(given, int):
        return given
    tensor, longest = _last_longest  # one read: another thread's forward may replace the pair meanwhile
    if tensor is not cu_seqlens:
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        _last_longest = (cu_seqlens, longest)
    return longest


def _attention_per_segment(q_NHD, k_NHD, v_NHD, cu_seqlens: torch.Tensor, scale) -> torch.Tensor:
    bounds = cu_seqlens.tolist()
    outs = [torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].transpose(0, 1) for t in (q_NHD, k_NHD, v_NHD)), scale=scale).transpose(0, 1)
        for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs).unsqueeze(0)


def _half_dtype(value: torch.Tensor) -> torch.dtype:
    """FlashAttention takes bf16/fp16; under autocast with fp32 weights some projections stay fp32."""
    if value.dtype in (torch.bfloat16, torch.float16):
        return value.dtype
    if torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return torch.bfloat16


def packing_kwargs(batch) -> dict:
    """The forward's keyword arguments that carry the batch's sample boundaries."""
    return {"packed_cu_seqlens": batch.cu_seqlens, "packed_max_seqlen": batch.max_seqlen}
