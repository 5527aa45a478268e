"""What a run recorded beside its weights: its flat config, in tunesmith_config.yaml (a run's output_dir) or in a
checkpoint's trainer_state.json. Light (yaml and json only): config validation reads it for an adapter to continue.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def recorded_config(folder: str | Path) -> dict:
    """The flat config of the run that wrote `folder`, {} where none is recorded or it cannot be read."""
    folder = Path(folder)
    try:
        if (folder / "tunesmith_config.yaml").is_file():
            flat = yaml.safe_load((folder / "tunesmith_config.yaml").read_text(encoding="utf-8"))
        elif (folder / "trainer_state.json").is_file():
            flat = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8")).get("config")
        else:
            return {}
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return flat if isinstance(flat, dict) else {}


def trained_rope(folder: str | Path) -> tuple[str, int] | None:
    """(rope_scaling, rope_max_length) of the run that trained the adapter in `folder`, if it asked for RoPE
    scaling: the base model's config.json does not say so."""
    flat = recorded_config(folder)
    if flat.get("rope_scaling") and flat.get("rope_max_length"):
        return flat["rope_scaling"], int(flat["rope_max_length"])
    return None
