"""Reading a DeepSpeed JSON config (LLaMA-Factory / HF Trainer format): the file, its ZeRO stage and offloads.

Config checks, `estimate` and the DeepSpeed engine all read the file through these functions.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def read_ds_config(path: str) -> dict:
    """The user's DeepSpeed JSON, with a clear error naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError([f"deepspeed: {path} does not exist; give a DeepSpeed JSON file "
                           "(examples/deepspeed/ds_z0.json ... ds_z3_offload.json)"])
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError([f"deepspeed: {path} is not valid JSON ({err})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"deepspeed: {path} must hold a JSON object"])
    return data


def zero_settings(train, base: dict | None = None) -> dict:
    """The run's zero_optimization section: the file's (`base`, read from train.deepspeed when not given),
    its stage overridden by zero_stage, 0 when neither says."""
    if base is None:
        base = read_ds_config(train.deepspeed) if train.deepspeed else {}
    zero = dict(base.get("zero_optimization") or {})
    if train.zero_stage is not None:
        zero["stage"] = train.zero_stage
    zero.setdefault("stage", 0)
    return zero


def offloads(zero: dict, what: str) -> bool:
    """Whether zero_optimization's `what` (offload_optimizer, offload_param) sends states to another device."""
    return (zero.get(what) or {}).get("device", "none") not in ("none", None)
