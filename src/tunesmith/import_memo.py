"""Work that third-party imports repeat, identically, in every process: kept on disk, so a command does it once.

- `importlib.metadata.packages_distributions()` reads the file list of every installed distribution to map import
  names to distribution names. transformers calls it at import (5.17) or when it looks up a package's version by a
  name its distribution does not carry (5.24+, flash-attn-4's): 1.07 s on a device machine
  (benchmarks/results/2026-12-06-start-clock-imports-h100.txt). Kept per sys.path: the key holds the metadata
  folders (dist-info, egg-info) on it with their modification times, which installing, upgrading or removing a
  distribution changes.
- transformers builds its lazy import structure by reading every file under transformers/models (~1,700) for its
  `__all__`: once at `import transformers` and again at `import transformers.models`, whose lru_cache holds 128 of
  the ~570 folders, so the second walk reuses none. Kept per transformers tree: the key holds every file's path,
  size and modification time (a ~20 ms walk), so an edited source tree is walked again.

Both are plain JSON under $TUNESMITH_CACHE/imports (no code is ever loaded from it); a memo that cannot be read is
computed again. TUNESMITH_IMPORT_MEMO=0 turns both off.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from .durable import replace_whole

_STRUCTURE_MODULE = "transformers.utils.import_utils"
_installed = False
folders_walked = 0  # folders transformers' own function read in this process (what the memo saves when warm)


def install() -> None:
    """Serve both from the memo for the rest of this process (once; before transformers is imported)."""
    global _installed
    if _installed or os.environ.get("TUNESMITH_IMPORT_MEMO", "1") == "0":
        return
    _installed = True
    importlib.metadata.packages_distributions = _memoised_distributions(importlib.metadata.packages_distributions)
    if _STRUCTURE_MODULE in sys.modules:  # imported already (a library user, the tests): the walks still to come
        _patch_structure(sys.modules[_STRUCTURE_MODULE])
    else:
        sys.meta_path.insert(0, _PatchOnImport())


def memo_dir() -> Path:
    from .data.cache import cache_root

    return cache_root() / "imports"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _read(name: str, key: str):
    try:
        return json.loads((memo_dir() / f"{name}-{key}.json").read_text())
    except (OSError, ValueError):
        return None


_KEPT = 8  # memos of one kind kept (the newest): environments that share a cache each keep theirs


def _write(name: str, key: str, value) -> None:
    """Atomically (ranks may write at once), keeping the newest memos of the kind; a memo is a speed-up only, so
    a folder that cannot be written is left alone."""
    folder = memo_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        replace_whole(folder / f"{name}-{key}.json", json.dumps(value))
        older = sorted(folder.glob(f"{name}-*.json"), key=lambda path: path.stat().st_mtime_ns, reverse=True)
        for stale in older[_KEPT:]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


# --- the import-name -> distributions map -------------------------------------------------------------------------

def sys_path_key() -> str:
    """Python's version and the sys.path entries that hold distributions' metadata folders, in order, each with
    those folders and their modification times (installing, upgrading or removing a distribution creates or
    deletes its folder). Entries without any (a script's own folder, a source tree) do not count."""
    parts = [sys.version]
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as entries:
                found = sorted(f"{e.name}\0{e.stat().st_mtime_ns}" for e in entries
                               if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:  # absent, a file (a zip) or unreadable
            continue
        if found:
            parts += [f"path {os.path.abspath(entry or '.')}", *found]
    return _digest("\n".join(parts))


def _memoised_distributions(compute):
    found: dict[str, dict] = {}  # this process's answer per key: callers get a copy each time

    def packages_distributions() -> dict[str, list[str]]:
        key = sys_path_key()
        if key not in found:
            mapping = _read("distributions", key)
            if not isinstance(mapping, dict):
                mapping = compute()
                _write("distributions", key, mapping)
            found[key] = mapping
        return {name: list(dists) for name, dists in found[key].items()}

    packages_distributions.__doc__ = compute.__doc__
    packages_distributions.__wrapped__ = compute
    return packages_distributions


# --- transformers' lazy import structure -------------------------------------------------------------------------

class _PatchOnImport:
    """A meta path finder that patches transformers' import_utils as soon as it has run (it runs inside
    `import transformers`, before the first walk), then leaves sys.meta_path."""

    def find_spec(self, name, path, target=None):
        if name != _STRUCTURE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = next((s for f in sys.meta_path if hasattr(f, "find_spec") and (s := f.find_spec(name, path, target))),
                    None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _patch_structure(module)

        spec.loader.exec_module = exec_module
        return spec


def tree_key(root: str) -> str:
    """Every .py file under root: its path, size and modification time."""
    parts, folders = [], [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir() and entry.name != "__pycache__":
                    folders.append(entry.path)
                elif entry.name.endswith(".py"):
                    stat = entry.stat()
                    parts.append(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return _digest("\n".join(sorted(parts)))


def _patch_structure(module) -> None:
    """create_import_structure_from_path, for the folders under transformers/models, from the memo."""
    create = getattr(module, "create_import_structure_from_path", None)
    walk = getattr(create, "__wrapped__", create)  # transformers' function without its lru_cache
    if walk is None:
        return
    root = os.path.normpath(os.path.join(os.path.dirname(module.__file__), os.pardir, "models"))
    memo: dict[str, dict] = {}
    key = None  # the tree's, read at the first call under root

    def load() -> None:
        nonlocal key
        key = tree_key(root)
        encoded = _read("transformers-structure", key)
        if encoded is not None:
            try:
                _remember(memo, root, _decode(encoded))
            except (KeyError, TypeError, ValueError):
                memo.clear()

    def create_import_structure_from_path(module_path):
        global folders_walked
        folder = os.path.normpath(os.fspath(module_path))
        if os.path.isfile(folder):
            folder = os.path.dirname(folder)
        if folder != root and not folder.startswith(root + os.sep):
            return create(module_path)
        if key is None:
            load()
        if folder not in memo:
            folders_walked += 1
            memo[folder] = walk(folder)  # its subfolders come back through this function
            if folder == root:
                try:
                    _write("transformers-structure", key, _encode(memo[root]))
                except TypeError:  # a shape this module does not know: walked in every process, as before
                    pass
        return memo[folder]

    create_import_structure_from_path.__doc__ = walk.__doc__
    module.create_import_structure_from_path = create_import_structure_from_path


def _remember(memo: dict, folder: str, structure: dict) -> None:
    """The folder's structure and, under its subfolders' names (str keys), theirs."""
    memo[folder] = structure
    for name, value in structure.items():
        if isinstance(name, str):
            _remember(memo, os.path.join(folder, name), value)


def _encode(value):
    """JSON for a structure: dicts keyed by folder names (str) or backends (frozenset), sets of exported names.
    Any other shape (a later transformers') raises TypeError: such a structure is not kept."""
    if isinstance(value, dict):
        return {"dict": [[_encode_key(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, set) and all(isinstance(name, str) for name in value):
        return {"names": sorted(value)}
    raise TypeError(f"an import structure holds a {type(value).__name__}")


def _encode_key(key):
    if isinstance(key, str):
        return key
    if isinstance(key, frozenset) and all(isinstance(name, str) for name in key):
        return {"backends": sorted(key)}
    raise TypeError(f"an import structure is keyed by a {type(key).__name__}")


def _decode(value):
    if "names" in value:
        return set(value["names"])
    return {k if isinstance(k, str) else frozenset(k["backends"]): _decode(v) for k, v in value["dict"]}
