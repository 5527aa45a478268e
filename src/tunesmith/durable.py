"""Files that survive a crash, and the digests that prove what was written: fsync'd writes and folders,
SHA-256 of a file, a file replaced whole or not at all. Shared by checkpoints (train/checkpoint.py), the
tokenized-data cache (data/cache.py), stored media (data/sources.py), the skipped-records list
(data/pipeline.py) and the import memos (import_memo.py)."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path


def file_digest(path: Path, *, fsync: bool = False) -> dict:
    """{"size", "sha256"} of a file, read once; fsync: flush it to disk on the way."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
        if fsync:
            os.fsync(f.fileno())
    return {"size": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: so the names of the files in it survive too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    """Write, flush and fsync a text file."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def replace_whole(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, renamed over it: a reader (another rank, a
    crash's next run) sees the old file or the new one, never part of one. The temporary file is removed when the
    write fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}-{uuid.uuid4().hex}.tmp")
    # created as open() creates a file (mode 0o666 less the umask; mkstemp's 0o600 would hide it from other users)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
