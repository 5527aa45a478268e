"""Rotary angles per token from each sample's own position ids, computed as the Hugging Face model does.

megatron-core's own RotaryEmbedding numbers positions 0..T-1 along the row (a packed row would
rotate its second sample as if it continued the first) and creates its frequencies on CUDA. The
engine instead takes the inverse frequencies (and the scaling variant: Llama 3's, linear, ...)
from the Hugging Face model's rotary module and hands megatron-core's attention the angles
[T, B, 1, head_dim] for the batch's per-sample position ids, which it applies unfused.
"""

from __future__ import annotations

import torch

from ...errors import ModelError
from ...models.forward import base_model


class RotaryAngles:
    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0):
        if abs(float(attention_scaling) - 1.0) > 1e-12:
            raise ModelError(f"this model's RoPE variant scales attention by {attention_scaling} (YaRN / LongRoPE), "
                             "which the Megatron engine does not apply; use backend: single or fsdp2")
        self.inv_freq = inv_freq.detach().float().cpu()

    @classmethod
    def of(cls, hf_model) -> "RotaryAngles":
        rotary = base_model(hf_model).model.rotary_emb
        return cls(rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0))

    def __call__(self, position_ids_BT: torch.Tensor) -> torch.Tensor:
        inv_freq = self.inv_freq.to(position_ids_BT.device)
        freqs_BTD = position_ids_BT.float()[..., None] * inv_freq
        emb_BTD = torch.cat([freqs_BTD, freqs_BTD], dim=-1)
        return emb_BTD.transpose(0, 1)[:, :, None, :].contiguous()
