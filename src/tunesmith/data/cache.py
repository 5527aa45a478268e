"""Fingerprinted cache of tokenized datasets, complete or invisible.

The key hashes everything that shapes the token ids: the data files' bytes, the
dataset_info entries, the tokenizer (vocabulary, special tokens), the chat
template and its kwargs, cutoff, stage, masking, mixing and sampling options.
Any change gives a new key, so a stale cache is never reused.

An entry is a `datasets.save_to_disk` folder (load_from_disk reads it) plus the
data report and a manifest: every file's size and SHA-256, written last. It is
built under a temporary name, each file fsync'd, the manifest written, and only
then renamed into place, so a crash never leaves a half entry under the real
name. Loading checks the manifest (files present, sizes, hashes) and opens the
arrow files; an entry that fails (a truncated or edited file, a missing one, no
manifest, an arrow error) is reported in one log line, removed and rebuilt: no
raw pyarrow error reaches the user. `overwrite_cache: true` replaces an entry
even when it verifies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from ..durable import file_digest, fsync_path, write_text
from ..errors import DataError
from .pages import release_mapped_pages

log = logging.getLogger("tunesmith")

# Bump when rendering code changes the produced ids for the same inputs, or the entry layout changes.
CACHE_FORMAT_VERSION = 6

REPORT = "tunesmith_report.json"
MANIFEST = "tunesmith_manifest.json"
DATA_FILE = "data-00000-of-00001.arrow"
_RELEASE_EVERY = 4  # batches written between releases of the mapped pages read (data/pages.py)


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


# ---------------------------------------------------------------- writing


class EntryWriter:
    """Streams arrow tables into a new entry `root/key`; `commit(report)` makes it visible, `abort()` drops it."""

    def __init__(self, key: str, root: Path | None = None, features=None, replace: bool = False):
        self.key, self.root = key, Path(root or tokenized_root())
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp = self.root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.features, self.replace = features, replace
        self.num_rows, self._writer, self._batches = 0, None, 0

    def write(self, table) -> None:
        """Append a pyarrow Table (columns as the entry's)."""
        from datasets import Features
        from datasets.arrow_writer import ArrowWriter

        if self._writer is None:
            self.features = self.features or Features.from_arrow_schema(table.schema)
            self._writer = ArrowWriter(features=self.features, path=str(self.tmp / DATA_FILE), writer_batch_size=1000)
        if len(table):
            self._writer.write_table(table)
            self.num_rows += len(table)
        self._batches += 1
        if self._batches % _RELEASE_EVERY == 0:
            release_mapped_pages()

    def write_dataset(self, dataset, batch_size: int = 1000) -> None:
        """Append every row of a datasets.Dataset, a batch at a time."""
        self.features = self.features or dataset.features
        for batch in dataset.with_format("arrow").iter(batch_size=batch_size):
            self.write(batch)

    def commit(self, report: dict, fingerprint: str | None = None) -> Path:
        from datasets import DatasetInfo

        if self._writer is None:
            raise ValueError("an empty entry: write at least one table (possibly empty) before commit")
        self._writer.finalize()
        self._writer.close()
        DatasetInfo(features=self.features).write_to_directory(str(self.tmp))
        state = {"_data_files": [{"filename": DATA_FILE}], "_fingerprint": fingerprint or self.key,
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        (self.tmp / "state.json").write_text(json.dumps(state))
        (self.tmp / REPORT).write_text(json.dumps(report))
        _write_manifest(self.tmp)
        return _place(self.tmp, self.root / self.key, self.replace)

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - cleaning up after another error
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def save_cached(key: str, dataset, report: dict, root: Path | None = None, replace: bool = False) -> Path:
    """Write `dataset` (a datasets.Dataset) and its report as entry `key` (see the module docstring)."""
    writer = EntryWriter(key, root, features=dataset.features, replace=replace)
    try:
        writer.write_dataset(dataset)
        if writer._writer is None:  # no rows: still an entry with the columns
            import pyarrow as pa

            writer.write(pa.Table.from_batches([], schema=dataset.features.arrow_schema))
        return writer.commit(report)
    except BaseException:
        writer.abort()
        raise


def copy_entry(source: Path, key: str, root: Path, replace: bool = True) -> Path:
    """A verified copy of entry `source` as `root/key` (tokenized_path keeps its own copy)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("cache-*", MANIFEST))
        _write_manifest(tmp)
        return _place(tmp, root / key, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_manifest(folder: Path) -> None:
    """fsync every file, then write the manifest of their sizes and hashes, last, and fsync it and the folder."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        files[str(path.relative_to(folder))] = file_digest(path, fsync=True)
    write_text(folder / MANIFEST, json.dumps({"format": CACHE_FORMAT_VERSION, "files": files}, indent=1))
    _fsync_dir(folder)


def _place(tmp: Path, final: Path, replace: bool) -> Path:
    """Rename the finished entry into place. An existing entry is kept when it verifies and `replace` is False
    (another process finished the same one first); otherwise it is moved aside first and removed after."""
    if final.exists():
        if not replace and verify_entry(final) is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        _discard(final)
    try:
        os.rename(tmp, final)
    except OSError as e:
        if final.exists() and not replace and verify_entry(final) is None:  # lost a race to an equal entry
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"could not put the tokenized cache in place at {final}: {e}. Check that its folder "
                        f"{final.parent} is writable, or remove {final}") from None
    _fsync_dir(final.parent)
    return final


def _discard(path: Path) -> None:
    """Remove an entry: renamed aside first, so a half-removed folder never sits under the entry's name."""
    aside = path.with_name(f".old-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    except OSError as e:
        raise DataError(f"could not replace the tokenized cache at {path}: {e}. Remove it by hand "
                        f"(`tunesmith data clean` removes every cached entry)") from None
    shutil.rmtree(aside, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fsync_path(path)
    except OSError:  # some file systems cannot fsync a folder
        pass


# ---------------------------------------------------------------- reading


def verify_entry(path: Path, hashes: bool = True) -> str | None:
    """None when the entry at `path` is complete and unchanged, else what is wrong (for the log line).
    Files not in the manifest (datasets' own cache-*.arrow written later) are ignored."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "incomplete (no manifest)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({type(e).__name__}: {e})"
    for name in (REPORT, "state.json", "dataset_info.json"):
        if name not in files:
            return f"incomplete (the manifest lists no {name})"
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            return f"incomplete ({name} is missing)"
        size = file.stat().st_size
        if size != entry.get("size"):
            return f"corrupt ({name} has {size} bytes, the manifest says {entry.get('size')})"
        if hashes and file_digest(file)["sha256"] != entry.get("sha256"):
            return f"corrupt ({name} does not match its SHA-256 in the manifest)"
    return None


def is_entry(path: Path) -> bool:
    """Whether `path` looks like a tunesmith entry (ours to verify, replace or rebuild), complete or not."""
    return (path / MANIFEST).exists() or (path / REPORT).exists()


def load_cached(key: str, root: Path | None = None, verify: bool = True):
    """(dataset, report) of entry `key`, or None when there is none or it fails verification (then it is removed,
    with one log line, so the caller rebuilds it)."""
    path = Path(root or tokenized_root()) / key
    if not path.exists():
        return None
    problem = verify_entry(path, hashes=verify)
    if problem is None:
        try:
            from datasets import load_from_disk

            dataset = load_from_disk(str(path))
            report = json.loads((path / REPORT).read_text())
            return dataset, report
        except Exception as e:  # noqa: BLE001 - pyarrow and datasets raise many types for a bad file
            problem = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    log.warning("tokenized cache %s is %s; rebuilding it", path, problem)
    _discard(path)
    return None


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
