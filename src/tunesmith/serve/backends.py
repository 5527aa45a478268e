"""The generation backends by infer_backend name, and load_engine: the one way chat, serve and the web UI
get an engine."""

from __future__ import annotations

from ..infer.options import ChatOptions
from .engine import Engine


def load_engine(options: ChatOptions, lora_modules: dict[str, str] | None = None,
                served_model_name: str | None = None) -> Engine:
    """The engine of options.model.infer_backend, with `lora_modules` (name -> adapter folder) served beside
    the base model under their names."""
    return BACKENDS[options.model.infer_backend](options, dict(lora_modules or {}), served_model_name)


def _huggingface(options, lora_modules, served_model_name) -> Engine:
    from .hf_engine import HFEngine

    return HFEngine.load(options, lora_modules, served_model_name)


def _vllm(options, lora_modules, served_model_name) -> Engine:
    from .vllm_engine import VllmEngine

    return VllmEngine.load(options, lora_modules, served_model_name)


BACKENDS = {"huggingface": _huggingface, "vllm": _vllm}
