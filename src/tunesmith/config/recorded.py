"""What a run recorded beside its weights: its flat config, in tunesmith_config.yaml (a run's output_dir) or in a
checkpoint's trainer_state.json, and an adapter's adapter_config.json (PEFT's). Light (yaml and json only): config
validation reads it for an adapter to continue,
inference for the data budget and the RoPE scaling of an adapter, resume for the config a checkpoint trained with.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import DataError


def saved_config(folder: str | Path) -> dict:
    """The flat config a run saved beside its model (tunesmith_config.yaml), {} for other folders."""
    saved = Path(folder) / "tunesmith_config.yaml"
    if not saved.exists():
        return {}
    try:
        flat = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise DataError(f"{saved} is not valid YAML: {err}") from None
    return flat if isinstance(flat, dict) else {}


def checkpoint_state(folder: str | Path) -> dict | None:
    """A checkpoint's trainer_state.json; None where there is none."""
    state = Path(folder) / "trainer_state.json"
    if not state.is_file():
        return None
    try:
        return json.loads(state.read_text(encoding="utf-8"))
    except ValueError as err:
        raise DataError(f"{state} is not valid JSON: {err}") from None


def checkpoint_config(folder: str | Path) -> dict | None:
    """The flat config a checkpoint's trainer_state.json records; None where it records none (another tool's or an
    older tunesmith's checkpoint, or no checkpoint)."""
    return (checkpoint_state(folder) or {}).get("config")


def adapter_config(folder: str | Path) -> dict:
    """An adapter folder's adapter_config.json (PEFT's)."""
    return json.loads((Path(folder) / "adapter_config.json").read_text())


def trained_rope(folder: str | Path) -> tuple[str, int] | None:
    """(rope_scaling, rope_max_length) of the run that trained the adapter in `folder`, if it asked for RoPE
    scaling: the base model's config.json does not say so."""
    flat = saved_config(folder) or checkpoint_config(folder) or {}
    if flat.get("rope_scaling") and flat.get("rope_max_length"):
        return flat["rope_scaling"], int(flat["rope_max_length"])
    return None
