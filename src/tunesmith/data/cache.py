"""Fingerprinted cache of tokenized datasets.

The key hashes everything that shapes the token ids: the data files' bytes, the
dataset_info entries, the tokenizer (vocabulary, special tokens), the chat
template and its kwargs, cutoff, stage, masking, mixing and sampling options.
Any change gives a new key, so a stale cache is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

# Bump when rendering code changes the produced ids for the same inputs.
CACHE_FORMAT_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("TUNESMITH_CACHE", Path.home() / ".cache" / "tunesmith"))


def tokenized_root() -> Path:
    return cache_root() / "tokenized"


def hash_path(path: Path, h) -> None:
    """Feed a file's or folder's bytes (sorted, with names) into hash h."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        h.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)


def tokenizer_fingerprint(tokenizer) -> str:
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update((backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))).encode())
    h.update(repr(sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())).encode())
    h.update(str(tokenizer.chat_template).encode())
    return h.hexdigest()


def fingerprint(options: dict, data_paths: list[Path]) -> str:
    """sha256 of the options (JSON) and the bytes of every data file."""
    h = hashlib.sha256()
    h.update(json.dumps({"version": CACHE_FORMAT_VERSION, **options}, sort_keys=True, default=str).encode())
    for path in data_paths:
        hash_path(path, h)
    return h.hexdigest()[:24]


def load_cached(key: str, root: Path | None = None):
    from datasets import load_from_disk

    path = (root or tokenized_root()) / key
    if (path / "dataset_info.json").exists() and (path / "tunesmith_report.json").exists():
        report = json.loads((path / "tunesmith_report.json").read_text())
        return load_from_disk(str(path)), report
    return None


def save_cached(key: str, dataset, report: dict, root: Path | None = None) -> Path:
    """Write under a temporary name, then rename: a crash never leaves a half cache that looks whole."""
    root = root or tokenized_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    dataset.save_to_disk(str(tmp))
    (tmp / "tunesmith_report.json").write_text(json.dumps(report))
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished the same cache first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def clean(root: Path | None = None) -> tuple[int, int]:
    """Remove every cached tokenized dataset; returns (entries, bytes) removed."""
    root = root or tokenized_root()
    if not root.exists():
        return 0, 0
    entries = [p for p in root.iterdir() if p.is_dir()]
    size = sum(f.stat().st_size for p in entries for f in p.rglob("*") if f.is_file())
    for p in entries:
        shutil.rmtree(p, ignore_errors=True)
    return len(entries), size
