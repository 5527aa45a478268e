"""Once-per-process work of a training run, started on a side thread as the command starts, so that it runs beside
the imports and set-up of the main thread instead of inside the first training step.

Triton hashes its own compiler (libtriton.so, about 500 MB, and its Python sources) the first time a process
compiles or looks up a kernel (`triton_key`, cached for the process). On the device machine that was 0.4-0.5 s of
the first step of issue 15's run, where Liger's and tunesmith's Triton kernels first launch
(benchmarks/results/2026-12-04-first-step.md). hashlib lets go of the GIL while it hashes large reads, so the
side thread costs the main thread little. Only where an NVIDIA driver is loaded: Triton kernels run on CUDA only.
"""

from __future__ import annotations

import importlib.util
import os
import threading

_thread: threading.Thread | None = None


def _triton_key() -> None:
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # Triton releases that kept it with the compiler
        try:
            from triton.compiler.compiler import triton_key
        except ImportError:
            return
    try:
        triton_key()
    except Exception:  # noqa: BLE001 - a head start only: Triton computes the key again when it compiles, in the
        pass  # main thread, and reports what fails there


def start() -> None:
    """Start hashing Triton's compiler on a side thread (once; where CUDA kernels can run and Triton is there)."""
    global _thread
    if _thread is None and os.path.exists("/proc/driver/nvidia/version") and importlib.util.find_spec("triton"):
        _thread = threading.Thread(target=_triton_key, name="tunesmith-prefetch", daemon=True)
        _thread.start()


def finish() -> None:
    """Wait for the side thread: called before the process forks workers (data preparation), so that no fork
    copies a process with the thread half-way through an import."""
    if _thread is not None:
        _thread.join()
