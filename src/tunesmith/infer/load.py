"""Load a trained output for inference: a full HF model folder or a PEFT adapter folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ModelError
from ..models.families import family_of
from ..models.load import auto_model_class
from ..models.tiny import resolve_model_path


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def _is_reward_model(path: str) -> bool:
    """A `stage: rm` output: a sequence-classification folder or a SEQ_CLS LoRA adapter."""
    adapter = Path(path) / "adapter_config.json"
    if adapter.exists():
        return json.loads(adapter.read_text()).get("task_type") == "SEQ_CLS"
    config = Path(path) / "config.json"
    return config.exists() and any(a.endswith("ForSequenceClassification")
                                   for a in json.loads(config.read_text()).get("architectures") or [])


def _model_class(config, path: str):
    if _is_reward_model(path):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification
    return auto_model_class(config)


def _head_kwargs(path: str) -> dict:
    return {"num_labels": 1} if _is_reward_model(path) else {}


def load_for_inference(path: str, *, device: torch.device, dtype: torch.dtype = torch.float32, merge: bool = False):
    """(model, preprocessor): the processor for vision/audio-language models, else the tokenizer.

    Adapters load on their base model; merge=True folds them in.
    """
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    path = resolve_model_path(path)
    if not Path(path).exists() and "/" not in path:
        raise ModelError(f"model '{path}' not found: give the output_dir of a run or a model folder")
    try:
        weights = path
        if is_adapter(path):
            weights = resolve_model_path(json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"])
        config = AutoConfig.from_pretrained(weights)
        multimodal = family_of(config) is not None
        preprocessor = (AutoProcessor if multimodal else AutoTokenizer).from_pretrained(path)
        model = _model_class(config, path).from_pretrained(weights, dtype=dtype, **_head_kwargs(path))
        if is_adapter(path):
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, path)
            if merge:
                model = model.merge_and_unload()
    except OSError as err:
        raise ModelError(f"cannot load '{path}': {err}") from None
    model.config.use_cache = True
    return model.to(device).eval(), preprocessor
