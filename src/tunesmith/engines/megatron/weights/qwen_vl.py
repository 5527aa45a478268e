"""Qwen2-VL / Qwen2.5-VL (Qwen2 text layers) and Qwen3-VL (Qwen3 text layers, deepstack): the language model
maps as its text family does; the vision tower (`model.visual`, merger and deepstack mergers included) stays a
Hugging Face module and keeps its weights as they are, under `visual.` on the GPTModel of the first pipeline
stage (build.py attaches it there)."""

from __future__ import annotations

import copy

from . import qwen2, qwen3

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_TEXT_FAMILY = {"qwen2_vl": qwen2, "qwen2_5_vl": qwen2, "qwen3_vl": qwen3}

HF_TEXT, HF_VISUAL, MC_VISUAL = "model.language_model.", "model.visual.", "visual."


def text_config(config):
    """The language model's config; whether the LM head is the embedding is the outer config's to say."""
    text = copy.copy(config.get_text_config())
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return text


def _text(config):
    return _TEXT_FAMILY[config.model_type], text_config(config)


def layout(config):
    family, text = _text(config)
    return family.layout(text)


def to_megatron(hf_state: dict, config) -> dict:
    family, text = _text(config)
    as_text = {"model." + k[len(HF_TEXT):]: v for k, v in hf_state.items() if k.startswith(HF_TEXT)}
    if "lm_head.weight" in hf_state:
        as_text["lm_head.weight"] = hf_state["lm_head.weight"]
    out = family.to_megatron(as_text, text)
    out.update({MC_VISUAL + k[len(HF_VISUAL):]: v for k, v in hf_state.items() if k.startswith(HF_VISUAL)})
    return out


def to_hf(mc_state: dict, config) -> dict:
    family, text = _text(config)
    as_text = family.to_hf({k: v for k, v in mc_state.items() if not k.startswith(MC_VISUAL)}, text)
    out = {(k if k == "lm_head.weight" else HF_TEXT + k[len("model."):]): v for k, v in as_text.items()}
    out.update({HF_VISUAL + k[len(MC_VISUAL):]: v for k, v in mc_state.items() if k.startswith(MC_VISUAL)})
    return out
