"""Core attention for megatron-core's local layer spec: PyTorch's variable-length FlashAttention on packed rows
on CUDA in bf16/fp16, PyTorch SDPA with a block-diagonal mask otherwise.

megatron-core's local DotProductAttention materialises the [B x heads, T, T] scores in a buffer it
allocates on CUDA (so it cannot run on the CPU) and softmaxes them explicitly. This module takes the
place of `core_attention` in the layer spec (build.py), with DotProductAttention's constructor and
forward signature, and runs one of two kernels, chosen per batch by forward.py (`attention_inputs`):

- packed rows on CUDA with half-precision inputs: the sample boundaries arrive as megatron-core's own
  PackedSeqParams (cu_seqlens over the flattened batch, `sbhd` layout so that megatron-core changes
  nothing else), and the single engine's kernel (models/attention.py's flash_varlen) computes only the
  blocks inside each sample, with no mask; where Liger is installed the query and key are rotated here first,
  from the cos/sin the PackedSeqParams carry (`rotary`, fused.py's rope_qk), instead of by megatron-core;
- under context parallelism, the keys and values of every context-parallel rank gathered first
  (context_parallel.py), then on CUDA in half precision the same kernel over the segments of
  context_parallel.varlen_plan (PackedSeqParams with `context_keys`), elsewhere SDPA with its mask;
- otherwise (the CPU, fp32): SDPA with the boolean mask of forward.py (True = masked in megatron-core's
  convention; SDPA's is the opposite).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

from ...models.attention import flash_varlen
from .context_parallel import gathered_sequence
from .fused import rope_qk


class PackedCoreAttention(MegatronModule):
    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None, cp_comm_type=None,
                 pg_collection=None, **_unused):
        super().__init__(config=config)
        tp = config.tensor_model_parallel_size
        self.num_heads = config.num_attention_heads // tp
        self.num_groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.context_parallel = config.context_parallel_size > 1

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_unused):
        """query [T, B, heads, D], key/value [T, B, groups, D]; a mask [B, 1, T, T] (True = masked) or
        packed_seq_params -> context [T, B, heads x D]. Under context parallelism T is this rank's tokens and the
        mask [B, 1, T, T x CP] that of context_parallel.py."""
        if attention_bias is not None:
            raise ValueError("PackedCoreAttention takes a mask or packed_seq_params, not an attention bias")
        dropout = self.dropout if self.training else 0.0
        if self.context_parallel:  # every rank's keys and values (context_parallel.py)
            key, value = gathered_sequence(key), gathered_sequence(value)
        if packed_seq_params is not None:
            return self._varlen(query, key, value, packed_seq_params, dropout)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [B, H, T, D]
        if self.num_heads != self.num_groups:
            repeat = self.num_heads // self.num_groups
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        allowed = None if attention_mask is None else ~attention_mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=attention_mask is None,
                                                 dropout_p=dropout, scale=self.softmax_scale)
        length, batch = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(length, batch, self.num_heads * self.head_dim)

    def _varlen(self, query, key, value, packed, dropout: float) -> torch.Tensor:
        """cu_seqlens number the tokens row after row (batch-major), as the collator counts them; under context
        parallelism the keys of each query segment are picked from the gathered ones (`packed.context_keys`). The
        context stays in the kernel's half dtype, as SDPA's does under autocast."""
        length, batch = query.shape[0], query.shape[1]
        rotary = getattr(packed, "rotary", None)
        if rotary is not None:  # the angles' cos and sin, which megatron-core's rotary did not apply (forward.py)
            query, key = rope_qk(query, key, *rotary)
        q = query.transpose(0, 1).reshape(batch * length, *query.shape[2:])
        picked = getattr(packed, "context_keys", None)
        if picked is None:
            k, v = (t.transpose(0, 1).reshape(batch * length, *t.shape[2:]) for t in (key, value))
        else:  # [T x B, groups, D] (sequence-major, as gathered), the picked rows
            k, v = (t.reshape(-1, *t.shape[2:]).index_select(0, picked) for t in (key, value))
        out = flash_varlen(q, k, v, packed.cu_seqlens_q, packed.max_seqlen_q, dropout=dropout,
                           scale=self.softmax_scale, cu_seqlens_k=packed.cu_seqlens_kv,
                           max_seqlen_k=packed.max_seqlen_kv)
        width = self.num_heads * self.head_dim
        if batch == 1:
            # Not transpose(0, 1): that leaves [T, 1, width] with strides (width, T x width, 1), which counts as
            # contiguous yet cannot be folded into [T, width] by torch.matmul, so megatron-core's next linear ran
            # as T batched matrix-vector products (63% of a Qwen3-4B step's GPU time, measured).
            return out.view(length, 1, width)
        return out.view(batch, length, width).transpose(0, 1).contiguous()
