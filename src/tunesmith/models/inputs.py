"""The keyword arguments of a model's forward for a collated batch.

Token ids with per-sample position ids (no attention mask: packed samples are
told apart by their positions, and under the varlen attention by the sample
boundaries passed as kwargs), the media tensors the model's forward takes, and
for mRoPE models each sample's own 3-D positions from the model's
`compute_3d_position_ids`. Nothing here decodes media.
"""

from __future__ import annotations

import inspect

import torch

from ..data.render import IGNORE_INDEX
from ..errors import DataError
from .attention import VARLEN, packing_kwargs
from .families import family_of


def mrope_position_ids(model, batch) -> torch.Tensor:
    """[4, B, T] position ids: row 0 the per-sample text positions (so the mask keeps samples apart),
    rows 1-3 each sample's own 3-D positions from the model's `compute_3d_position_ids`. Computed on the CPU
    and sent once: on the GPU every sample's lookups would each wait for the device (dozens a forward)."""
    inner = _rope_module(model)
    text, segments, input_ids, types = (t.cpu() for t in (batch.position_ids_BT, batch.segment_ids_BT,
                                                            batch.input_ids_BT, batch.token_types_BT))
    out = text.unsqueeze(0).repeat(4, 1, 1)
    for b in range(text.shape[0]):
        for seg in segments[b].unique().tolist():
            if seg < 0:
                continue
            cols = (segments[b] == seg).nonzero().squeeze(-1)
            grids = {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.media_per_sample[seg].items()}
            pos = _segment_positions(inner, input_ids[b, cols].unsqueeze(0), grids, types[b, cols].unsqueeze(0))
            if pos is not None:
                out[1:, b, cols] = pos[:, 0].to(out.dtype)
    return out.to(batch.position_ids_BT.device, non_blocking=True)


def _rope_module(model):
    for module in model.modules():
        if hasattr(module, "compute_3d_position_ids"):
            return module
    raise DataError(f"{type(model).__name__} has no compute_3d_position_ids: it does not use mRoPE")


def _segment_positions(inner, ids, grids: dict, token_types) -> torch.Tensor | None:
    if not grids:
        return None
    fn = inner.compute_3d_position_ids
    offered = {
        "input_ids": ids, "inputs_embeds": None, "attention_mask": torch.ones_like(ids), "cache": None,
        "mm_token_type_ids": token_types, "image_grid_thw": grids.get("image_grid_thw"),
        "video_grid_thw": grids.get("video_grid_thw"), "second_per_grid_ts": grids.get("second_per_grid_ts"),
        "video_second_per_grid": grids.get("second_per_grid_ts"),
        "audio_feature_lengths": grids.get("audio_feature_lengths"),
        "use_audio_in_video": grids.get("use_audio_in_video", False),
    }
    params = inspect.signature(fn).parameters
    pos = fn(**{k: v for k, v in offered.items() if k in params})
    inner.rope_deltas = None  # no state may leak into the next forward or a later generate()
    return pos


def forward_inputs(model, batch) -> dict:
    """The model's media keyword arguments that its forward() takes, plus mRoPE positions when it uses them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(base.forward).parameters
    inputs = {k: v for k, v in batch.media.items() if k in params}
    widen_half_pixels(base, inputs)
    if "use_audio_in_video" in params:
        inputs["use_audio_in_video"] = any(g.get("use_audio_in_video") for g in batch.media_per_sample)
    family = family_of(base.config)
    if family is not None and family.image_token_types and batch.token_types_BT is not None:
        # Gemma 3: an image's soft tokens see each other both ways, as in its pretraining
        inputs["token_type_ids"] = (batch.token_types_BT == 1).long()
    if family is not None and family.prefix_lm:
        inputs["token_type_ids"] = prefix_suffix_types(batch)
    return inputs


def widen_half_pixels(model, inputs: dict) -> dict:
    """Llama 4's image processor returns bf16 pixels; an fp32 model (fp32 on the CPU, or fp32 master weights under
    autocast) takes them widened, which loses nothing (autocast casts them back for its matmuls)."""
    half = [k for k, v in inputs.items() if k.startswith("pixel_values") and torch.is_tensor(v)
            and v.dtype in (torch.bfloat16, torch.float16)]
    if half and next(model.parameters()).dtype == torch.float32:
        inputs.update({k: inputs[k].float() for k in half})
    return inputs


def prefix_suffix_types(batch) -> torch.Tensor:
    """PaliGemma's token_type_ids: 0 on each row's prompt, up to its first supervised token (a prefix attended
    both ways), 1 from there on (causal). A token is supervised when the token before it predicts it
    (targets are shifted by one). Rows hold one sample each (the family does not pack)."""
    supervised = torch.zeros_like(batch.targets_BT, dtype=torch.long)
    supervised[:, 1:] = (batch.targets_BT[:, :-1] != IGNORE_INDEX).long()
    return supervised.cummax(dim=1).values


def model_inputs(model, batch) -> dict:
    """Keyword arguments of the model's forward for a batch: ids, per-sample positions, media."""
    inputs = {"input_ids": batch.input_ids_BT, "position_ids": batch.position_ids_BT, "attention_mask": None,
              "use_cache": False}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = family_of(base.config)
    if family is not None and family.first_position:  # PaliGemma counts positions from 1, as its forward does
        inputs["position_ids"] = batch.position_ids_BT + family.first_position
    if getattr(base.config, "_attn_implementation", None) == VARLEN:
        inputs.update(packing_kwargs(batch))
    if batch.token_types_BT is None:
        return inputs
    inputs.update(forward_inputs(model, batch))
    if family is not None and family.uses_mrope:
        inputs["position_ids"] = mrope_position_ids(base, batch)
    return inputs
