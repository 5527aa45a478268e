"""Load a trained output for inference: a full HF model folder or a PEFT adapter folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ModelError
from ..models.tiny import resolve_model_path


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def load_for_inference(path: str, *, device: torch.device, dtype: torch.dtype = torch.float32, merge: bool = False):
    """(model, tokenizer). Adapters load on their base model; merge=True folds them in."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(path)
    if not Path(path).exists() and "/" not in path:
        raise ModelError(f"model '{path}' not found: give the output_dir of a run or a model folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if is_adapter(path):
            from peft import PeftModel

            base_path = json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]
            base = AutoModelForCausalLM.from_pretrained(resolve_model_path(base_path), dtype=dtype)
            model = PeftModel.from_pretrained(base, path)
            if merge:
                model = model.merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as err:
        raise ModelError(f"cannot load '{path}': {err}") from None
    model.config.use_cache = True
    return model.to(device).eval(), tokenizer
