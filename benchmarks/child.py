"""Run a benchmark's training command as a child process that does not outlive the benchmark.

`timeout 200 python benchmarks/grpo_bench.py ...` stops the benchmark with SIGTERM; its `tunesmith train` child
then finishes its step and saves (a graceful stop) while the next command of the script has started beside it on
the same GPU (seen 2026-12-05: vLLM's start then found 20 of 79 GiB free). With run_child, SIGTERM ends the wait
and the child is killed and reaped before the benchmark exits.
"""

from __future__ import annotations

import signal
import subprocess
import sys


def _stop(signum, frame):
    sys.exit(128 + signum)  # SystemExit inside subprocess.run: it kills the child and waits for it


def run_child(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(command, **kwargs), the child killed if this process gets SIGTERM meanwhile."""
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return subprocess.run(command, **kwargs)
    finally:
        signal.signal(signal.SIGTERM, previous)
