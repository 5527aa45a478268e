"""Once-per-process work of a training run, started on a side thread as the command starts, so that it runs beside
the imports and set-up of the main thread instead of inside the first training step.

Triton hashes its own compiler (libtriton.so, about 500 MB, and its Python sources) the first time a process
compiles or looks up a kernel (`triton_key`, cached for the process). On the device machine that was 0.4-0.5 s of
the first step of issue 15's run, where Liger's and tunesmith's Triton kernels first launch
(benchmarks/results/2026-12-04-first-step.md). hashlib lets go of the GIL while it hashes large reads, so the
side thread costs the main thread little.

Then the thread creates this rank's CUDA context (LOCAL_RANK's device) and cuBLAS's handle, which the model phase
would otherwise create on the main thread. Only where an NVIDIA driver is loaded: Triton kernels run on CUDA only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

_thread: threading.Thread | None = None
_stop = threading.Event()  # set by finish(): the side thread stops waiting for torch


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


def _torch_imported() -> bool:
    """Whether the main thread has finished importing torch: the side thread does not import it itself, so that the
    two threads never wait on each other's half-imported modules."""
    while True:
        torch = sys.modules.get("torch")
        if torch is not None and not getattr(torch.__spec__, "_initializing", False):
            return True
        if _stop.wait(0.02):
            return False


def _cuda_context() -> None:
    if not _torch_imported():
        return
    import torch

    try:
        if torch.cuda.is_available():
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            ones = torch.ones(8, 8, device=device)
            torch.mm(ones, ones)  # loads cuBLAS and creates its handle
            torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - a head start only: the main thread creates the context itself and reports
        pass  # what fails there


def _run() -> None:
    _triton_key()
    _cuda_context()


def start() -> None:
    """Start the once-per-process work on a side thread (once; where CUDA kernels can run and Triton is there)."""
    global _thread
    if _thread is None and os.path.exists("/proc/driver/nvidia/version") and importlib.util.find_spec("triton"):
        _thread = threading.Thread(target=_run, name="tunesmith-prefetch", daemon=True)
        _thread.start()


def finish() -> None:
    """Wait for the side thread: called before the process forks workers (data preparation), so that no fork
    copies a process with the thread half-way through an import."""
    _stop.set()
    if _thread is not None:
        _thread.join()
