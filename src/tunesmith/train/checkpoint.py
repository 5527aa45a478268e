"""Checkpoints: complete or invisible, and never a way to run someone else's code.

A checkpoint is written under a temporary name (`.tmp-checkpoint-N`), every file and
folder is fsynced, a manifest (`manifest.json`: each file's relative path, size and
SHA-256) is written last and signed with this installation's HMAC key, and only then
is the folder renamed to `checkpoint-N`. A crash at any moment leaves either the
finished checkpoint or an invisible temporary folder (removed at the next save).

Loading never runs code from a checkpoint: weights are safetensors, our own
`torch.load`s are `weights_only=True`, and the state a backend keeps as a pickle
(DCP's `.metadata`, DeepSpeed's files) is read only from a checkpoint whose manifest
verifies and is signed with this installation's key — or when the user says so
(`trust_checkpoint: true`).

The key: `checkpoint_key_file`, else `TUNESMITH_CHECKPOINT_KEY_FILE`, else
`$XDG_CONFIG_HOME/tunesmith/checkpoint.key` (`~/.config/...`). Rank 0 creates it
(32 random bytes as hex, mode 0600) on the first save if it is missing; every rank
reads it at resume, so the nodes of a multi-node job (and a job restarted on another
machine) must see the same file: put it on a shared file system and point the
variable at it. See docs/guarantees.md ("Checkpoints").

A Hugging Face Trainer / LLaMA-Factory `checkpoint-N` (safetensors weights,
`trainer_state.json` with `global_step`, pickled optimizer.pt / rng_state.pth) resumes
too: its weights and step always, its pickled state only with `trust_checkpoint`.
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import os
import random
import re
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import dist
from ..durable import file_digest as _hash
from ..durable import fsync_path as _fsync_dir
from ..durable import write_text as _write_file
from ..engines.base import CheckpointError, read_torch_file
from ..errors import raised_at
from .checkpoint_key import KEY_ENV, ensure_key, key_id, key_path, read_key, signature  # noqa: F401 (KEY_ENV, read_key: the API)

log = logging.getLogger("tunesmith")

_CKPT = re.compile(r"^checkpoint-(\d+)$")
MANIFEST = "manifest.json"
_FORMAT = "tunesmith-checkpoint/1"
_HASHES = re.compile(r"^\.hashes-\d+\.json$")  # each rank's share of the hashing, merged by rank 0
_STALE_PREFIXES = (".tmp-checkpoint-", ".old-checkpoint-")
FAULT_SLOW_SAVE_ENV = "TUNESMITH_FAULT_SLOW_SAVE"  # tests: seconds to pause at each phase of a save
_HF_PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


# ---- files --------------------------------------------------------------------------------------

def _files(root: Path) -> list[str]:
    """Every file under root (relative POSIX paths, sorted), the manifest and the hashing scratch files excepted."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST or _HASHES.match(rel) or path.is_dir():
            continue
        out.append(rel)
    return out


def read_json(path: Path, what: str):
    """A checkpoint's JSON file, or a CheckpointError naming it (missing, unreadable, truncated, not JSON)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing ({what}); the checkpoint is incomplete: resume from another "
                              "checkpoint (resume_from_checkpoint: <path>)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} ({what}) is corrupt or truncated: {err}. Resume from another checkpoint "
                              "(resume_from_checkpoint: <path>), or delete this one") from None


def _fault_pause() -> None:
    """Fault-injection hook for the tests: pause inside a save so a kill lands mid-save."""
    pause = os.environ.get(FAULT_SLOW_SAVE_ENV)
    if pause:
        time.sleep(float(pause))


# ---- RNG ----------------------------------------------------------------------------------------

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


def _rng_file() -> str:
    return f"rng_state_{dist.rank()}.json" if dist.world() > 1 else "rng_state.json"


def load_rng(ckpt: Path) -> None:
    """This rank's RNG state; a checkpoint from another number of ranks falls back to rank 0's."""
    path = ckpt / _rng_file()
    if not path.exists():
        candidates = [ckpt / "rng_state.json", ckpt / "rng_state_0.json"]
        path = next((c for c in candidates if c.exists()), candidates[0])
    state = read_json(path, "RNG state")
    try:
        set_rng_state(state)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path} (RNG state) is not what tunesmith writes ({type(err).__name__}: {err}); "
                              "resume from another checkpoint") from None


# ---- saving -------------------------------------------------------------------------------------

def save_checkpoint(output_dir: Path, step: int, engine, tokenizer, trainer_state: dict, *, only_model: bool,
                    key_file: str | None = None) -> Path:
    """Every rank calls this (sharded engines save collectively); rank 0 owns the folder, the manifest and the
    rename. A failed write (disk full, ...) leaves the earlier checkpoints as they were and is a CheckpointError."""
    output_dir = Path(output_dir)
    final, tmp = output_dir / f"checkpoint-{step}", output_dir / f".tmp-checkpoint-{step}"
    try:
        key = ensure_key(key_path(key_file)) if dist.is_main() else b""  # before anything is written
        if dist.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        _write_state(tmp, engine, tokenizer, trainer_state, only_model)
        dist.barrier()
        _hash_share(tmp)  # each rank fsyncs and hashes its share of the files
        dist.barrier()
        if dist.is_main():
            _seal(tmp, final, step, key)
        dist.barrier()
    except CheckpointError:
        raise
    except Exception as err:  # a full disk reaches us as OSError, or as torch's RuntimeError("unexpected pos ...")
        if dist.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failure(output_dir, final, err)) from err
    return final


def _write_state(tmp: Path, engine, tokenizer, trainer_state: dict, only_model: bool) -> None:
    engine.export_hf(tmp, tokenizer)
    _fault_pause()
    if not only_model:
        engine.save(tmp)
        _write_file(tmp / _rng_file(), json.dumps(rng_state()))
        if dist.is_main():
            _write_file(tmp / "trainer_state.json", json.dumps(trainer_state, indent=1))
    _fault_pause()


def _hash_share(tmp: Path) -> None:
    files = _files(tmp)[dist.rank()::dist.world()]
    share = {rel: _hash(tmp / rel, fsync=True) for rel in files}
    for rel in files:  # a writer that lost the end of a file to a full disk without saying so
        if not _looks_whole(tmp / rel):
            raise OSError(errno.EIO, "the file is cut short (a full disk?)", str(tmp / rel))
    _write_file(tmp / f".hashes-{dist.rank()}.json", json.dumps(share))


def _looks_whole(path: Path) -> bool:
    """Cheap structure checks: a safetensors file as long as its header says, a torch.save zip with its end
    record."""
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            try:
                header = json.loads(f.read(int.from_bytes(head, "little")))
            except ValueError:
                return False
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return path.stat().st_size == 8 + int.from_bytes(head, "little") + max(ends, default=0)
    if path.suffix in (".pt", ".pth"):
        return zipfile.is_zipfile(path)
    return True


def _seal(tmp: Path, final: Path, step: int, key: bytes) -> None:
    """Merge the ranks' hashes into the signed manifest (written last), fsync the folders, rename."""
    entries = {}
    for part in sorted(tmp.glob(".hashes-*.json")):
        entries.update(json.loads(part.read_text()))
        part.unlink()
    missing = sorted(set(_files(tmp)) - set(entries))
    if missing:  # a file appeared after the ranks listed them: never sign what was not hashed
        raise CheckpointError(f"saving {final.name}: {missing[:3]} were written after the files were hashed")
    for path in sorted(tmp.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise CheckpointError(f"saving {final.name}: {path} is not a regular file")
    body = {"format": _FORMAT, "step": step, "files": entries, "key_id": key_id(key)}
    _fault_pause()
    _write_file(tmp / MANIFEST, json.dumps({**body, "signature": signature(key, body)}, indent=1))
    for folder in sorted({p for p in tmp.rglob("*") if p.is_dir()} | {tmp}, key=lambda p: -len(p.parts)):
        _fsync_dir(folder)
    old = final.with_name(f".old-{final.name}")
    if final.exists():  # the same step saved again (a resumed run): the old one goes only once the new is in place
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _save_failure(output_dir: Path, final: Path, err: Exception) -> str:
    kept = [p.name for p in _ours(output_dir) if p != final]
    previous = f"the earlier checkpoint {kept[-1]} is intact" if kept else "no earlier checkpoint exists"
    what = (err.strerror or str(err)) if isinstance(err, OSError) else f"{type(err).__name__}: {err}"
    where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
    if not isinstance(err, (OSError, RuntimeError)):  # not how a full or read-only disk reaches us: a bug
        return (f"saving {final} failed: {what}{raised_at(err)}; {previous}. This is an error in tunesmith's save, "
                "not in the disk: please report it with this message")
    try:
        free = f"{shutil.disk_usage(output_dir).free / 2**30:.1f} GiB free there now"
    except OSError:
        free = "free space unknown"
    return (f"saving {final} failed: {what}{where}; {previous}. Fix: free space in output_dir ({free}; "
            "save_total_limit and save_only_model: true keep less) or make it writable, then resume")


def rotate(output_dir: Path, keep: int | None, keep_also: Path | None = None) -> None:
    """Keep the newest `keep` of our checkpoints, and `keep_also` (the best one, for load_best_model_at_end);
    remove what interrupted saves left behind."""
    if not dist.is_main():
        return
    for stale in Path(output_dir).iterdir():
        if stale.name.startswith(_STALE_PREFIXES) and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    if keep is None:
        return
    for old in _ours(output_dir)[:-keep]:
        if keep_also is None or old.resolve() != keep_also.resolve():
            shutil.rmtree(old, ignore_errors=True)


# ---- finding a checkpoint to resume --------------------------------------------------------------

def _numbered(output_dir: Path) -> list[Path]:
    if not Path(output_dir).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir() if (m := _CKPT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _ours(output_dir: Path) -> list[Path]:
    """Checkpoints tunesmith finished writing (they hold a manifest), oldest first."""
    return [p for p in _numbered(output_dir) if (p / MANIFEST).is_file()]


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoints that look resumable (they hold a trainer_state.json: ours, or the Hugging Face Trainer's),
    oldest first. Whether one is complete and trusted is decided by resolve_resume and restore."""
    return [p for p in _numbered(output_dir) if (p / "trainer_state.json").is_file()]


def manifest_files(manifest) -> dict:
    """The manifest's {relative path: {size, sha256}}, or a CheckpointError if it is not one of ours."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise CheckpointError("manifest.json is not a tunesmith manifest (no file table)")
    outside = [rel for rel in files if rel.startswith("/") or ".." in Path(rel).parts]
    if outside:
        raise CheckpointError(f"manifest.json names files outside the checkpoint: {outside[:3]}")
    return files


def is_hf_trainer(path: Path) -> bool:
    """A checkpoint-N of the Hugging Face Trainer / LLaMA-Factory: its trainer_state.json, none of our files (a
    finished tunesmith run's output_dir also holds a trainer_state.json, beside its config and summary)."""
    ours = (MANIFEST, "engine_state.pt", "dcp", "tunesmith_config.yaml", "train_summary.json")
    if any((path / name).exists() for name in ours):
        return False
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "global_step" in state and "data" not in state


def _why_not(path: Path) -> str | None:
    """Why `path` cannot be resumed (cheap checks: files present, sizes as recorded), or None."""
    if (path / MANIFEST).is_file():
        try:
            files = manifest_files(read_json(path / MANIFEST, "the checkpoint's manifest"))
        except CheckpointError as err:
            return f"its manifest is unreadable ({err})"
        if "trainer_state.json" not in files:
            return "not a resumable checkpoint: saved with save_only_model (weights only, no optimizer state)"
        for rel, entry in sorted(files.items()):
            try:
                size = (path / rel).stat().st_size
            except OSError:
                return f"{rel} is missing"
            if size != entry.get("size"):
                return f"{rel} is {size} bytes, the manifest says {entry.get('size')} (truncated or changed)"
        return _json_problem(path / "trainer_state.json")
    if (path / "trainer_state.json").is_file():
        return _json_problem(path / "trainer_state.json")  # the HF Trainer's, or an unsigned one of ours
    return ("not a resumable checkpoint: no manifest.json and no trainer_state.json (not a checkpoint, or a copy "
            "cut short)")


def _json_problem(path: Path) -> str | None:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{path.name} is corrupt or truncated ({err})"
    return None if isinstance(state, dict) and "global_step" in state else f"{path.name} holds no global_step"


_reported: set[tuple[str, str]] = set()


def resolve_resume(output_dir: Path, resume) -> Path | None:
    """The checkpoint to resume: the path given (refused with the reason if it cannot be resumed), or with
    `true` the newest in output_dir that is complete, naming the newer ones skipped and why."""
    if resume in (None, False, "false", ""):
        return None
    if resume is True or resume == "true":
        skipped = []
        for path in reversed(_numbered(output_dir)):
            reason = _why_not(path)
            if reason is None:
                _report_skipped(skipped, path)
                return path
            skipped.append((path, reason))
        _report_skipped(skipped, None)
        listed = "".join(f"\n  - {p.name}: {r}" for p, r in skipped)
        raise CheckpointError(f"resume_from_checkpoint: true, but {output_dir} has no complete checkpoint{listed}")
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint: {path} is not a folder")
    reason = _why_not(path)
    if reason is not None:
        raise CheckpointError(f"resume_from_checkpoint: {path} cannot be resumed: {reason}. Resume another "
                              "checkpoint, or use it as model_name_or_path to start a new run from its weights.")
    return path


def _report_skipped(skipped: list, chosen: Path | None) -> None:
    for path, reason in skipped:
        if (str(path), reason) not in _reported:  # setup asks twice; say it once
            _reported.add((str(path), reason))
            log.warning("resume: skipping %s: %s%s", path.name, reason,
                        f" (resuming from {chosen.name})" if chosen is not None else "")


# ---- verifying and restoring -------------------------------------------------------------------

@dataclass
class Verdict:
    """What verification found: damage (never loaded) and why the checkpoint is not trusted (if it is not)."""

    damage: list[str] = field(default_factory=list)
    untrusted: str | None = None


def verify(path: Path, key_file: str | None = None) -> Verdict:
    """Check every file against the manifest (each rank hashes its share) and the manifest's signature (each
    rank with its own copy of the key). Collective under torch.distributed: every rank gets the same verdict."""
    verdict = Verdict()
    if not (path / MANIFEST).is_file():
        verdict.untrusted = "it has no manifest.json (written by an older tunesmith or another tool, or edited)"
    else:
        manifest = read_json(path / MANIFEST, "the checkpoint's manifest")
        try:
            verdict.damage = _damage(path, manifest_files(manifest))
            verdict.untrusted = _signature_problem(manifest, key_path(key_file))
        except CheckpointError as err:
            verdict.damage = [str(err)]
    damaged_elsewhere = dist.max_int(int(bool(verdict.damage)))
    if damaged_elsewhere and not verdict.damage:
        verdict.damage = ["another rank found a damaged file (see its message)"]
    if dist.max_int(int(verdict.untrusted is not None)) and verdict.untrusted is None:
        verdict.untrusted = "another rank could not verify its signature (see its message)"
    return verdict


def _signature_problem(manifest: dict, key_file: Path) -> str | None:
    signed, signed_by = manifest.get("signature"), manifest.get("key_id")
    if not signed or not isinstance(signed, str):
        return "its manifest is not signed"
    try:
        key = read_key(key_file)
    except CheckpointError as err:
        return f"it cannot be checked: {err}"
    if signed_by != key_id(key):
        return (f"it was signed with another key (id {signed_by}; this installation's key {key_file} has id "
                f"{key_id(key)}): written on another machine or with another checkpoint_key_file")
    body = {k: v for k, v in manifest.items() if k != "signature"}
    if not hmac.compare_digest(signed, signature(key, body)):
        return "its manifest was changed after it was signed"
    return None


def _damage(path: Path, files: dict) -> list[str]:
    """This rank's share of the files that differ from the manifest, and (all ranks) files it does not list."""
    problems = [f"{rel}: not listed in the manifest (added after the save)" for rel in _files(path) if rel not in files]
    for rel in sorted(files)[dist.rank()::dist.world()]:
        target = path / rel
        if target.is_symlink() or not target.is_file():
            problems.append(f"{rel}: missing or not a regular file")
            continue
        actual = _hash(target)
        if actual["size"] != files[rel].get("size"):
            problems.append(f"{rel}: {actual['size']} bytes, the manifest says {files[rel].get('size')} (truncated)")
        elif actual["sha256"] != files[rel].get("sha256"):
            problems.append(f"{rel}: its SHA-256 differs from the manifest's (corrupt or changed)")
    return problems


def check_trusted(path: Path, key_file: str | None, trust: bool) -> None:
    """Refuse a damaged checkpoint always, an untrusted one unless trust_checkpoint: true (then say so)."""
    verdict = verify(path, key_file)
    if verdict.damage:
        listed = "".join(f"\n  - {d}" for d in verdict.damage)
        raise CheckpointError(f"checkpoint {path} is damaged; nothing was loaded:{listed}\nFix: resume from an "
                              "earlier checkpoint (resume_from_checkpoint: <path>), or delete this one (then "
                              "resume_from_checkpoint: true takes the newest that verifies)")
    if verdict.untrusted is None:
        return
    if trust:
        log.warning("trust_checkpoint: true: loading %s although %s", path, verdict.untrusted)
        return
    raise CheckpointError(
        f"checkpoint {path} is refused: {verdict.untrusted}. Its optimizer/engine state is stored with pickle, "
        "which can run code when loaded, so tunesmith loads it only from checkpoints this installation signed.\n"
        f"Fix: if you wrote it with another key, set checkpoint_key_file (or {KEY_ENV}) to that key file; if "
        "you trust where it came from, set trust_checkpoint: true; to start a new run from its weights only, use "
        f"model_name_or_path: {path}")


def restore(path: Path, engine, output_cfg, source) -> dict:
    """Verify, then load a checkpoint into the engine and the RNG; returns its trainer state (with "data",
    the step source's position)."""
    trust = bool(getattr(output_cfg, "trust_checkpoint", False))
    key_file = getattr(output_cfg, "checkpoint_key_file", None)
    if is_hf_trainer(path):
        return _restore_hf_trainer(path, engine, trust, source)
    check_trusted(path, key_file, trust)
    engine.load(path, trusted=True)  # weights, optimizer and schedule, however the backend stores them
    saved = read_json(path / "trainer_state.json", "trainer state")
    load_rng(path)
    return saved


def _restore_hf_trainer(path: Path, engine, trust: bool, source) -> dict:
    """Weights (safetensors), step and data position always; optimizer.pt / rng_state.pth (pickles from
    outside this installation, still loaded weights_only) only with trust_checkpoint."""
    state = read_json(path / "trainer_state.json", "the Hugging Face Trainer's state")
    step = int(state["global_step"])
    data = _data_state_after(source, step, path)
    optimizer_state = None
    if trust and (path / "optimizer.pt").exists():
        optimizer_state = read_torch_file(path / "optimizer.pt")
    engine.load_hf_trainer(path, step, optimizer_state=optimizer_state, trusted=trust)
    rng = path / f"rng_state_{dist.rank()}.pth"
    rng = rng if dist.world() > 1 and rng.exists() else path / "rng_state.pth"
    if trust and rng.exists():
        _load_hf_rng(rng)
    if not trust:
        present = [n for n in _HF_PICKLES if (path / n).exists()]
        log.warning("%s is a Hugging Face Trainer checkpoint: resuming its weights at step %d; the optimizer starts "
                    "fresh and the RNG from the seed%s (set trust_checkpoint: true to load them)", path, step,
                    f" ({', '.join(present)} are pickles this installation did not write)" if present else "")
    log.warning("the data continues at step %d of tunesmith's order (the Trainer's sample order is not kept)", step)
    return {"global_step": step, "num_skipped_steps": 0, "tokens_seen": int(state.get("num_input_tokens_seen", 0)),
            "data": data}


def _data_state_after(source, step: int, path: Path) -> dict:
    """The sequence step source's position after `step` steps of its plan (the Trainer's position, in ours)."""
    from .plan import Position

    plan = getattr(source, "plan", None)
    if plan is None:
        raise CheckpointError(f"{path} is a Hugging Face Trainer checkpoint; those resume the sequence stages "
                              "(pt, sft, rm, dpo, kto) only. Start online RL from its weights (model_name_or_path)")
    position = Position()
    for _ in range(step):
        position = plan.advance(position)
    return {"epoch": position.epoch, "micro_batch": position.micro_batch}


def _load_hf_rng(path: Path) -> None:
    """The Trainer's rng_state.pth (python, numpy, cpu, cuda), loaded weights_only with numpy's arrays allowed."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct

    state = read_torch_file(path, allow=[np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32))])
    try:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["cpu"])
        if torch.cuda.is_available() and "cuda" in state:
            cuda = state["cuda"]
            torch.cuda.set_rng_state_all(cuda) if isinstance(cuda, (list, tuple)) else torch.cuda.set_rng_state(cuda)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path} is not the Trainer's RNG state ({type(err).__name__}: {err}); delete it "
                              "to resume with the RNG from the seed") from None
