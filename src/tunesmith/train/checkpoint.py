"""Checkpoints: written under a temporary name and renamed, so a crash never
leaves a half checkpoint that looks whole. `trainer_state.json` is the marker of a
resumable checkpoint; it is written last, inside the temporary folder.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from .. import dist
from ..errors import TunesmithError

_CKPT = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict:
    state = {
        "python": _jsonable(random.getstate()),
        "numpy": _jsonable(np.random.get_state()),
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def _jsonable(obj):
    if isinstance(obj, np.ndarray):
        return {"ndarray": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, (tuple, list)):
        return [_jsonable(o) for o in obj]
    return obj


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = state["numpy"]
    np.random.set_state((npy[0], np.array(npy[1]["ndarray"], dtype=npy[1]["dtype"]), *npy[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def save_checkpoint(output_dir: Path, step: int, engine, tokenizer, trainer_state: dict, *, only_model: bool) -> Path:
    """Every rank calls this (sharded engines save collectively); rank 0 owns the folder and the rename."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".tmp-checkpoint-{step}"
    if dist.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    engine.export_hf(tmp, tokenizer)
    if not only_model:
        engine.save(tmp)
        (tmp / _rng_file()).write_text(json.dumps(rng_state()))
    dist.barrier()
    if dist.is_main():
        if not only_model:  # written last: the marker of a complete, resumable checkpoint
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def _rng_file() -> str:
    return f"rng_state_{dist.rank()}.json" if dist.world() > 1 else "rng_state.json"


def load_rng(ckpt: Path) -> None:
    """This rank's RNG state; a checkpoint from another number of ranks falls back to rank 0's."""
    path = ckpt / _rng_file()
    if not path.exists():
        candidates = [ckpt / "rng_state.json", ckpt / "rng_state_0.json"]
        path = next((c for c in candidates if c.exists()), candidates[0])
    set_rng_state(json.loads(path.read_text()))


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete, resumable checkpoints, oldest first."""
    if not Path(output_dir).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir() if (m := _CKPT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / "trainer_state.json").exists()]


def resolve_resume(output_dir: Path, resume) -> Path | None:
    if resume in (None, False, "false", ""):
        return None
    if resume is True or resume == "true":
        found = list_checkpoints(output_dir)
        if not found:
            raise TunesmithError(f"resume_from_checkpoint: true, but {output_dir} has no complete checkpoint")
        return found[-1]
    path = Path(resume)
    if not (path / "trainer_state.json").exists():
        raise TunesmithError(
            f"resume_from_checkpoint: {path} is not a resumable checkpoint (no trainer_state.json; saved with "
            "save_only_model or incomplete). Use it as model_name_or_path to start a new run from its weights."
        )
    return path


def rotate(output_dir: Path, keep: int | None) -> None:
    if keep is None or not dist.is_main():
        return
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
