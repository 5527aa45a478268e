"""The installation's checkpoint signing key: where it lives, how it is made and read, and the HMAC it signs
manifests with (train/checkpoint.py explains why checkpoints are signed)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from pathlib import Path

from ..durable import fsync_path as _fsync_dir
from ..engines.base import CheckpointError

log = logging.getLogger("tunesmith")

KEY_ENV = "TUNESMITH_CHECKPOINT_KEY_FILE"


def key_path(configured: str | None = None) -> Path:
    """checkpoint_key_file, else $TUNESMITH_CHECKPOINT_KEY_FILE, else the user's config dir."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "tunesmith" / "checkpoint.key"


def read_key(path: Path) -> bytes:
    """The key's bytes; a key others may write is refused (they could sign anything with it)."""
    try:
        mode = path.stat().st_mode
        key = path.read_bytes().strip()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint key at {path} (this installation has not saved a checkpoint with "
                              f"it); set checkpoint_key_file or {KEY_ENV} to the key the checkpoint was written "
                              "with") from None
    except OSError as err:
        raise CheckpointError(f"cannot read the checkpoint key {path}: {err}") from None
    if mode & 0o022:
        raise CheckpointError(f"the checkpoint key {path} is writable by other users (mode {mode & 0o777:o}); "
                              f"run `chmod 600 {path}`")
    if len(key) < 32:
        raise CheckpointError(f"the checkpoint key {path} holds {len(key)} bytes; a key needs at least 32 (delete "
                              "it and a new one is made at the next save, which makes earlier checkpoints unsigned)")
    return key


def ensure_key(path: Path) -> bytes:
    """Read the key, creating it first if missing (O_EXCL temp file + link: two processes racing agree on one)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made it first: theirs wins
            log.info("created the checkpoint signing key %s (keep it; on several nodes share it, see "
                     "docs/guarantees.md)", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        _fsync_dir(path.parent)
    return read_key(path)


def key_id(key: bytes) -> str:
    """A fingerprint that names a key in messages without revealing it."""
    return hashlib.sha256(b"tunesmith-checkpoint-key-id:" + key).hexdigest()[:16]


def signature(key: bytes, body: dict) -> str:
    """The HMAC-SHA-256 of a manifest's body (canonical JSON) under the key."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()
