"""Resident memory bounded while streaming through memory-mapped arrow files.

`datasets` memory-maps its arrow files. Every page a pass reads stays mapped in the process (counted in its RSS as
RssFile) until the file is unmapped or the kernel runs short of memory, so one pass over a 10 GB tokenized dataset
leaves a 10 GB resident set although no heap was used: RSS would grow with the number of rows. The pages are
clean copies of file data, so dropping them from the process is free and safe: `madvise(MADV_DONTNEED)` on a
read-only file mapping only unmaps them, and the next read faults them back in from the page cache.

`release_mapped_pages()` does that for every read-only mapping of an `.arrow` file; `PageReleasing(fn)` wraps a
`datasets.map` / loop function and calls it every few calls, in whichever process (data worker) runs it. On systems
without /proc/self/maps or madvise it does nothing.
"""

from __future__ import annotations

import ctypes
import os

_MADV_DONTNEED = 4
_libc = None


def _madvise():
    global _libc
    if _libc is None:
        try:
            # The process's own symbols include libc's (ctypes.util.find_library would fork ldconfig).
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc = libc
        except (OSError, AttributeError):
            _libc = False
    return _libc.madvise if _libc else None


def release_mapped_pages(suffix: str = ".arrow") -> int:
    """Drop this process's resident pages of read-only mappings of files ending in `suffix`; returns bytes released."""
    madvise = _madvise()
    if madvise is None or not os.path.exists("/proc/self/maps"):
        return 0
    released = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or "w" in fields[1] or not fields[5].rstrip("\n").endswith(suffix):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
    return released


class PageReleasing:
    """`fn` (a datasets.map function), releasing mapped arrow pages every `every` calls (1 suits a batched map: a
    release costs ~1 ms, a batch of 1,000 rows seconds; a per-row map wants thousands). Picklable, so it travels to
    data workers."""

    def __init__(self, fn, every: int = 1):
        self.fn = fn
        self.every = every
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls % self.every == 0:
            release_mapped_pages()
        return self.fn(*args, **kwargs)
