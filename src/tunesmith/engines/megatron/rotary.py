"""Rotary angles per token from each sample's own position ids, computed as the Hugging Face model does.

megatron-core's own RotaryEmbedding numbers positions 0..T-1 along the row (a packed row would
rotate its second sample as if it continued the first) and creates its frequencies on CUDA. The
engine instead takes the inverse frequencies (and the scaling variant: Llama 3's, linear, ...)
from the Hugging Face model's rotary module and hands megatron-core's attention the angles
[T, B, 1, head_dim] for the batch's per-sample position ids, which it applies unfused.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL rotate by 3-D positions (time, height, width: mRoPE): each sample's own,
from the Hugging Face model's compute_3d_position_ids (models/inputs.py), the frequency channels split
into the config's mrope_section as contiguous chunks (Qwen2/2.5-VL) or interleaved (Qwen3-VL).
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
        base = base_model(hf_model)
        text = getattr(base.model, "language_model", base.model)
        rotary = text.rotary_emb
        section = (getattr(text.config, "rope_parameters", None) or {}).get("mrope_section")
        if section:
            return MropeAngles(rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0), hf_model=base,
                               section=list(section), interleaved=base.config.model_type == "qwen3_vl")
        return cls(rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0))

    def for_batch(self, batch) -> torch.Tensor:
        return self(batch.position_ids_BT)

    def __call__(self, position_ids_BT: torch.Tensor) -> torch.Tensor:
        return _as_megatron(self._freqs(position_ids_BT))

    def _freqs(self, position_ids: torch.Tensor) -> torch.Tensor:
        return position_ids.float()[..., None] * self.inv_freq.to(position_ids.device)


def _as_megatron(freqs_BTD: torch.Tensor) -> torch.Tensor:
    """Half-dimension angles [B, T, D/2] -> megatron-core's rotary_pos_emb [T, B, 1, D] (rotate-half layout)."""
    emb_BTD = torch.cat([freqs_BTD, freqs_BTD], dim=-1)
    return emb_BTD.transpose(0, 1)[:, :, None, :].contiguous()


class MropeAngles(RotaryAngles):
    def __init__(self, inv_freq, attention_scaling, *, hf_model, section: list[int], interleaved: bool):
        super().__init__(inv_freq, attention_scaling)
        if sum(section) != self.inv_freq.numel():
            raise ModelError(f"mrope_section {section} does not cover the {self.inv_freq.numel()} rotary frequencies")
        self.hf_model, self.section, self.interleaved = hf_model, section, interleaved

    def for_batch(self, batch) -> torch.Tensor:
        """A batch with media: each sample's 3-D positions; text alone: its 1-D positions (then t = h = w)."""
        if batch.token_types_BT is None:
            return self(batch.position_ids_BT)
        from ...models.inputs import mrope_position_ids

        return self.of_3d(mrope_position_ids(self.hf_model, batch)[1:])

    def of_3d(self, position_ids_3BT: torch.Tensor) -> torch.Tensor:
        freqs_3BTD = self._freqs(position_ids_3BT)
        if self.interleaved:  # Qwen3-VL: channel i takes height when i % 3 == 1, width when i % 3 == 2
            chosen = freqs_3BTD[0].clone()
            for axis in (1, 2):
                cols = slice(axis, self.section[axis] * 3, 3)
                chosen[..., cols] = freqs_3BTD[axis][..., cols]
        else:  # Qwen2/2.5-VL: the first section's channels from time, the next from height, the rest from width
            chunks = freqs_3BTD.split(self.section, dim=-1)
            chosen = torch.cat([chunk[axis] for axis, chunk in enumerate(chunks)], dim=-1)
        return _as_megatron(chosen)
