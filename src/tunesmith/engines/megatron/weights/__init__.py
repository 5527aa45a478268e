"""Hugging Face <-> megatron-core weight maps, one module per family, picked by `config.model_type`.

Each family module has MODEL_TYPES, layout(config), to_megatron(hf_state, config) and
to_hf(mc_state, config): pure functions of full (unsharded) state dicts; engines/megatron/shards.py
splits the fused tensors over tensor-parallel ranks. A vision-language family also has
text_config(config): the language model's config, which sizes the GPTModel.
"""

from __future__ import annotations

from types import ModuleType

from ....errors import ModelError
from . import llama, qwen2, qwen3, qwen3_moe, qwen_vl

_FAMILIES: tuple[ModuleType, ...] = (qwen2, qwen3, qwen3_moe, llama, qwen_vl)
BY_MODEL_TYPE: dict[str, ModuleType] = {t: family for family in _FAMILIES for t in family.MODEL_TYPES}


def family_map(config) -> ModuleType:
    """The weight map of a Hugging Face config's family; a clear refusal for any other model."""
    model_type = getattr(config, "model_type", None)
    if model_type in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[model_type]
    why = f"it maps {', '.join(sorted(BY_MODEL_TYPE))}"
    if hasattr(config, "vision_config") or hasattr(config, "audio_config"):
        why += "; of the vision/audio-language models only Qwen2-VL, Qwen2.5-VL and Qwen3-VL"
    raise ModelError(f"model_type '{model_type}' cannot run on backend: megatron ({why}); use backend: single, "
                     "fsdp2 or deepspeed for this model")


def language_config(config):
    """The config that sizes the GPTModel: a vision-language model's text config, else the config itself."""
    family = family_map(config)
    return family.text_config(config) if hasattr(family, "text_config") else config
