"""RoPE scaling (LLaMA-Factory's `rope_scaling`): stretch a model's rotary positions to a longer context.

As LLaMA-Factory does it for training: when the run's length (cutoff_len) exceeds the positions the model was
trained for, the config's RoPE parameters get the chosen type (linear, dynamic, yarn, llama3) and the factor
ceil(length / positions), and max_position_embeddings grows by that factor. transformers' rotary modules read
them when the model is built, so the config is changed before the weights load, and the saved config.json
carries the scaling to every later load (transformers, PEFT, vLLM).
"""

from __future__ import annotations

import logging
import math

from ..errors import ModelError
from ..quiet import say_once


def scale_rope(config, kind: str, length: int) -> bool:
    """Apply `kind` scaling to `config` (a transformers config; a vision-language model's text config) so that it
    covers `length` positions; a length within the model's positions leaves it unchanged, said in the log.
    Returns whether the config changed."""
    part = _rope_holder(config)
    params = dict(part.rope_parameters or {})
    positions = part.max_position_embeddings
    current = params.get("rope_type", "default")
    if current != "default":
        if length <= positions:
            say_once(f"rope_scaling: {config.model_type} already scales RoPE ({current}) to {positions} positions, "
                     f"which covers {length}; left as it is")
            return False
        raise ModelError(f"rope_scaling: {config.model_type} already scales RoPE ({current}, factor "
                         f"{params.get('factor')}, {positions} positions); a second scaling would replace it. "
                         f"Remove rope_scaling, or lower cutoff_len (rope_max_length) to at most {positions}")
    if length <= positions:
        say_once(f"rope_scaling: {length} positions (cutoff_len) are within the {positions} that "
                 f"{config.model_type} was trained for; RoPE is not scaled (as LLaMA-Factory)", logging.WARNING)
        return False
    factor = float(math.ceil(length / positions))
    params.update(rope_type=kind, factor=factor)
    if kind in ("dynamic", "yarn", "llama3"):
        params["original_max_position_embeddings"] = positions
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if kind == "dynamic":
        say_once("rope_scaling: dynamic NTK scaling changes the frequencies with the sequence length, which may not "
                 "suit fine-tuning (LLaMA-Factory warns too); linear or yarn keep them fixed", logging.WARNING)
    part.rope_parameters = params
    part.max_position_embeddings = int(positions * factor)
    say_once(f"rope_scaling: {kind} RoPE, factor {factor:g}: {positions} -> {part.max_position_embeddings} positions")
    return True


def _rope_holder(config):
    """The config that holds the language model's RoPE parameters (itself, or a vision-language model's
    text_config), refused for models whose RoPE is set per layer type or that have none."""
    for part in (getattr(config, "text_config", None), config):
        if part is not None and getattr(part, "rope_parameters", None) and hasattr(part, "max_position_embeddings"):
            if "rope_type" not in part.rope_parameters and "rope_theta" not in part.rope_parameters:
                raise ModelError(f"rope_scaling: {config.model_type} sets RoPE per layer type "
                                 f"({', '.join(part.rope_parameters)}); scaling it is not available; remove "
                                 "rope_scaling")
            return part
    raise ModelError(f"rope_scaling: {config.model_type} has no RoPE parameters to scale; remove rope_scaling")
