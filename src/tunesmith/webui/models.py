"""The models a runs root holds, to chat with or export: each run's final model, its checkpoints, and
exported folders."""

from __future__ import annotations

import re
from pathlib import Path

from .runs import RunsRoot, child_dirs

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
_MAX_DEPTH = 4  # saves/<model>/<type>/<run>/checkpoint-N
_STEP = re.compile(r"checkpoint-(\d+)$")


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHTS)


def list_models(root: RunsRoot) -> list[dict]:
    """Every folder below the root that holds weights, each with its kind (model, checkpoint, adapter)."""
    found: list[Path] = []
    _walk(root.root, 0, found)
    return [_describe(root, path) for path in sorted(found, key=_order)]


def _walk(folder: Path, depth: int, found: list[Path]) -> None:
    if folder.name == "pissa_init":  # a PiSSA run's adapter as initialised (models/pissa.py): not a model
        return
    if has_weights(folder):
        found.append(folder)
    if depth >= _MAX_DEPTH:
        return
    for child in child_dirs(folder):
        _walk(child, depth + 1, found)


def _order(path: Path) -> tuple:
    match = _STEP.search(path.name)
    parent = path.parent if match else path
    return (str(parent), int(match.group(1)) if match else 1 << 62)


def _describe(root: RunsRoot, path: Path) -> dict:
    adapter = (path / "adapter_model.safetensors").is_file()
    match = _STEP.search(path.name)
    kind = "checkpoint" if match else "model"
    return {"id": root.run_id(path), "kind": kind, "adapter": adapter,
            "step": int(match.group(1)) if match else None}
