"""`tunesmith export`: merge LoRA into its base and write a standalone HF model (safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import TunesmithError
from .load import load_for_inference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_model(model_path: str, export_dir: str, *, dtype: str = "bfloat16", max_shard_size: str = "5GB",
                 adapters: list[str] | tuple[str, ...] = (), device: str = "cpu", template: str = "auto",
                 trust_remote_code: bool = False, cache_dir: str | None = None, revision: str = "main") -> Path:
    """Write `model_path` (a run's output_dir, or a base model with `adapters` merged in) to `export_dir`.

    device: "cpu", or "auto" (the GPU when there is one); template: a named chat template to save into the
    exported tokenizer (auto keeps the one the model or adapter carries).
    """
    out = Path(export_dir)
    if out.exists() and any(out.iterdir()):
        raise TunesmithError(f"export_dir {out} is not empty; choose a new folder")
    from ..models.load import pick_device

    where = pick_device() if device == "auto" else torch.device("cpu")
    model, preprocessor = load_for_inference(model_path, device=where, merge=True, adapters=adapters,
                                             trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                                             revision=revision)
    if template != "auto":
        _use_template(model, preprocessor, template)
    model = model.to(DTYPES[dtype])
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size=max_shard_size)
    _pad_left(getattr(preprocessor, "tokenizer", preprocessor))
    preprocessor.save_pretrained(str(out))
    return out


def _pad_left(tokenizer) -> None:
    """The exported tokenizer pads on the left, for batched generation, as LLaMA-Factory's export sets it (saved from
    init_kwargs: transformers 5 writes those, not the attribute)."""
    tokenizer.padding_side = "left"
    tokenizer.init_kwargs["padding_side"] = "left"


def _use_template(model, preprocessor, name: str) -> None:
    """Save the named template into the tokenizer and stop generation at its end-of-turn tokens (as training does)."""
    from ..data.templates import resolve, stop_tokens

    tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
    chat_template = resolve(tokenizer, name)[0]
    tokenizer.chat_template = chat_template
    if tokenizer is not preprocessor:
        preprocessor.chat_template = chat_template
    generation = getattr(model, "generation_config", None)
    if generation is None:  # reward models do not generate
        return
    stop_ids = tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, name))
    eos = generation.eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    generation.eos_token_id = eos + [i for i in stop_ids if i not in eos]
