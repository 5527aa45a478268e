"""The vision tower of Qwen2-VL / Qwen2.5-VL / Qwen3-VL on the Megatron engine's first pipeline stage.

The tower stays the Hugging Face module (patch embedding, blocks, merger; Qwen3-VL's deepstack mergers),
a copy attached to the GPTModel as `visual`, so that it trains with it and its weights keep their names
(weights/qwen_vl.py). On the first stage the image and video features replace the embeddings of their
placeholder tokens (the batch's token types: 1 image, 2 video), in the batch's order as the Hugging Face
model scatters them. Qwen3-VL adds each deepstack feature map to the hidden states of the visual tokens
after decoder layer k (k = 0, 1, ...), here through a forward hook on that layer.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ...errors import DataError, TunesmithError
from ...models.forward import base_model
from .stages import chunks_of

_MEDIA = (("pixel_values", "image_grid_thw", 1, "image"), ("pixel_values_videos", "video_grid_thw", 2, "video"))


def hf_vision_tower(hf_model):
    """The Hugging Face model's vision tower (under a PeftModel too); None for a text model."""
    return getattr(base_model(hf_model).model, "visual", None)


def attach_vision_tower(model, hf_model) -> None:
    """A copy of the Hugging Face model's vision tower on the GPTModel that embeds (the first stage's, its first
    chunk under the interleaved schedule), its parameters trainable or frozen as apply_finetuning left them
    (freeze_vision_tower, ...)."""
    visual = hf_vision_tower(hf_model)
    for chunk in chunks_of(model):
        if visual is not None and chunk.pre_process:
            chunk.visual = copy.deepcopy(visual)


def tower_of(model):
    """The vision tower this rank holds (on the first stage), else None."""
    return next((chunk.visual for chunk in chunks_of(model) if getattr(chunk, "visual", None) is not None), None)


def is_tower_parameter(name: str) -> bool:
    """Whether `name` (in a GPTModel, or in VirtualStages' chunks) is a vision tower's parameter."""
    return name.startswith("visual.") or ".visual." in name


def freeze_language_model(model) -> None:
    """freeze_language_model: everything but the vision tower stays as loaded."""
    for name, param in model.named_parameters():
        if not is_tower_parameter(name):
            param.requires_grad_(False)


def merged_embeddings(model, batch, embeds_TBH: torch.Tensor) -> tuple[torch.Tensor, list | None]:
    """The first stage's decoder input with the media features in place, and Qwen3-VL's deepstack feature maps
    as [T, B, H] tensors (zero outside the visual tokens), one per early decoder layer."""
    visual = getattr(model, "visual", None)
    if visual is None or batch.token_types_BT is None:
        return embeds_TBH, None
    embeds_BTH = embeds_TBH.transpose(0, 1)
    deepstack = None
    for pixels_key, grid_key, token_type, kind in _MEDIA:
        if pixels_key not in batch.media:
            continue
        dtype = next(visual.parameters()).dtype
        out = visual(batch.media[pixels_key].to(dtype), grid_thw=batch.media[grid_key], return_dict=True)
        where_BT1 = (batch.token_types_BT == token_type)[..., None]
        _check_count(kind, int(where_BT1.sum()), out.pooler_output.shape[0])
        embeds_BTH = embeds_BTH.masked_scatter(where_BT1, out.pooler_output.to(embeds_BTH.dtype))
        features = getattr(out, "deepstack_features", None) or []
        if deepstack is None and features:
            deepstack = [torch.zeros_like(embeds_BTH) for _ in features]
        for k, feature in enumerate(features):
            deepstack[k] = deepstack[k].masked_scatter(where_BT1, feature.to(embeds_BTH.dtype))
    return embeds_BTH.transpose(0, 1).contiguous(), deepstack and [extra.transpose(0, 1) for extra in deepstack]


def _check_count(kind: str, tokens: int, features: int) -> None:
    if tokens != features:
        raise DataError(f"this batch has {tokens} {kind} placeholder tokens but the vision tower gave {features} "
                        f"{kind} features; the data was prepared with another processor or pixel budget "
                        "(overwrite_cache: true prepares it again)")


@contextlib.contextmanager
def deepstack_added(model, deepstack: list | None):
    """Inside: decoder layer k adds deepstack[k] ([T, B, H], as its output hidden states) to them."""
    if not deepstack:
        yield
        return
    layers = model.decoder.layers
    if len(deepstack) > len(layers):
        raise TunesmithError(f"Qwen3-VL adds deepstack features after its first {len(deepstack)} decoder layers, "
                             f"but this pipeline stage holds {len(layers)}; give the first stage more layers")

    def adder(extra_TBH):
        def hook(_module, _inputs, output):
            hidden, *rest = output
            return (hidden + extra_TBH, *rest)
        return hook

    handles = [layers[k].register_forward_hook(adder(extra)) for k, extra in enumerate(deepstack)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
