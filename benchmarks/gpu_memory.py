"""The peak GPU memory of a benchmark's run, as nvidia-smi sees it (every process on the GPU, the allocator's cache
included), sampled on a side thread while the run lasts."""

from __future__ import annotations

import os
import subprocess
import threading


def first_visible_gpu() -> str:
    """The GPU a one-GPU run uses, as nvidia-smi numbers it: CUDA_VISIBLE_DEVICES' first, else 0."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]


class GpuPeaks(threading.Thread):
    """The peak of nvidia-smi's memory.used on each GPU of `gpus` (nvidia-smi's indices; None: all of them)."""

    def __init__(self, gpus: str | None = None):
        super().__init__(daemon=True)
        self.query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                      *(["-i", gpus] if gpus else [])]
        self.peaks: list[int] = []  # MiB
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            try:
                used = [int(v) for v in subprocess.run(self.query, capture_output=True, text=True,
                                                       timeout=5).stdout.split()]
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self.peaks = [max(a, b) for a, b in zip(self.peaks, used)] if self.peaks else used
            self._done.wait(0.2)

    def stop(self) -> list[float]:
        """Each GPU's peak in GiB (empty without nvidia-smi)."""
        self._done.set()
        self.join()
        return [round(p / 1024, 1) for p in self.peaks]
