"""`tunesmith export`: merge LoRA into its base and write a standalone HF model."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import TunesmithError
from .load import load_for_inference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_model(model_path: str, export_dir: str, *, dtype: str = "bfloat16", max_shard_size: str = "5GB") -> Path:
    out = Path(export_dir)
    if out.exists() and any(out.iterdir()):
        raise TunesmithError(f"export_dir {out} is not empty; choose a new folder")
    model, preprocessor = load_for_inference(model_path, device=torch.device("cpu"), merge=True)
    model = model.to(DTYPES[dtype])
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size=max_shard_size)
    preprocessor.save_pretrained(str(out))
    return out
