"""Core attention for megatron-core's local layer spec through PyTorch's scaled_dot_product_attention.

megatron-core's local DotProductAttention materialises the [B x heads, T, T] scores in a buffer it
allocates on CUDA (so it cannot run on the CPU) and softmaxes them explicitly. SDPA computes the
same attention in fused kernels on any device, with the boolean mask of forward.py (True = masked
in megatron-core's convention; SDPA's is the opposite). It takes the place of `core_attention` in
the layer spec (build.py), with DotProductAttention's constructor and forward signature.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


class SDPACoreAttention(MegatronModule):
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

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_unused):
        """query [T, B, heads, D], key/value [T, B, groups, D], mask [B, 1, T, T] (True = masked) ->
        context [T, B, heads x D]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPACoreAttention takes a mask, not packed_seq_params or an attention bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [B, H, T, D]
        if self.num_heads != self.num_groups:
            repeat = self.num_heads // self.num_groups
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        allowed = None if attention_mask is None else ~attention_mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=attention_mask is None,
                                                 dropout_p=self.dropout if self.training else 0.0,
                                                 scale=self.softmax_scale)
        length, batch = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(length, batch, self.num_heads * self.head_dim)
