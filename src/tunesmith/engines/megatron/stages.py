"""Pipeline stages: which part of the full megatron-core weights a stage holds, under which names. Pure.

megatron-core numbers a stage's decoder layers from 0 in its state dict (layer `offset + i` of the model is
the stage's `decoder.layers.i`); the first stage holds the embedding (and a vision-language model's vision
tower), the last the final norm and the output layer (or a reward model's score head). A model whose output
layer is its embedding (tied) gets a copy of the embedding as the last stage's output layer when the two are
on different stages; the engine keeps the copies equal by summing their gradients (parallel.py).
"""

from __future__ import annotations

import re

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_FIRST = ("embedding.", "visual.")  # everything else outside the layers is the last stage's
EMBEDDING, OUTPUT = "embedding.word_embeddings.weight", "output_layer.weight"


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The model's layers on `stage` of `pp` (megatron-core's even split; degrees.py checks that pp divides)."""
    per_stage = num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


def stage_state(full: dict, layers: range, *, first: bool, last: bool, tied: bool) -> dict:
    """The weights of the stage holding `layers` (first / last: whether it is the first / last stage), by the
    stage's own names."""
    out = {}
    for name, tensor in full.items():
        match = _LAYER.match(name)
        if match:
            if int(match.group(1)) in layers:
                out[f"decoder.layers.{int(match.group(1)) - layers.start}.{name[match.end():]}"] = tensor
        elif (first if name.startswith(_FIRST) else last):
            out[name] = tensor
    if tied and last and not first:
        out[OUTPUT] = full[EMBEDDING]
    return out


def model_names(local: dict, layers: range) -> dict:
    """A stage's weights under the whole model's names (the inverse of stage_state; a tied model's copy of the
    embedding on the last stage stays under the output layer's name, which the Hugging Face maps of a tied model
    do not read)."""
    out = {}
    for name, tensor in local.items():
        match = _LAYER.match(name)
        out[f"decoder.layers.{int(match.group(1)) + layers.start}.{name[match.end():]}" if match else name] = tensor
    return out


def chunks_of(model) -> list:
    """The model chunks this rank holds: its virtual pipeline stages in order (build.VirtualStages) under the
    interleaved schedule, else the one GPTModel."""
    return list(getattr(model, "chunks", None) or [model])
