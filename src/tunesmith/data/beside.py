"""Data preparation in a forked child process, while set-up goes on with work that does not need the data.

Tokenizing issue 15's workload (1,000 samples, 8 workers) took 0.8-1.4 s of the run's start on the GPU machines,
with the main process idle, waiting for datasets' workers. Set-up has about as much work that does not depend on
the data: importing the attention kernels, the model's code (the memory estimate builds the model on the meta
device) and Liger (peft with it). So a single-process run forks a child where set-up would prepare the data; the
child runs prepare_data, which writes the tokenized cache entry, while this process does that work; then this
process reads the entry the child wrote.

The data is the one prepare_data gives here: the child runs it with the same config, tokenizer and media
processor and hands over the cache entries it wrote or verified; this process reads those entries as they are
(prepare_data's `known`: the child already fingerprinted the inputs and hashed the entry's files, so neither is done
twice on the way to the first step). Whatever the child did not finish (an error, a signal, a crash), this process
prepares the data itself, so errors and their messages are those of prepare_data run here. Runs of several
processes tokenize across their ranks instead (pipeline._tokenize_across_ranks) and do not fork.

Fork safety: the child is forked only where no other Python thread runs (before the status spinner starts its
thread, after the start-up side thread has finished: prefetch.finish); it never touches CUDA, and it leaves with
os._exit, so nothing of the parent's state is torn down twice.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from .. import collector, dist
from .pipeline import PreparedData, prepare_data


def _can_fork(cfg) -> bool:
    """A single process on Linux with no other Python thread: in a program that runs threads of its own (a
    notebook's kernel, an application calling train()), a thread holding a lock at the fork (logging's, the
    console's) would leave the child waiting for it forever, so the data is prepared in-process there."""
    return bool(cfg.data.dataset) and dist.world() == 1 and sys.platform == "linux" and not _other_threads()


def _other_threads() -> bool:
    return threading.active_count() > 1


class PreparingData:
    """`with PreparingData(cfg, tokenizer, media) as preparing: ...; data = preparing.result()`: the data is
    prepared in a child from the moment the object is made (a run that cannot fork prepares it in result())."""

    def __init__(self, cfg, tokenizer, media=None):
        self.cfg, self.tokenizer, self.media = cfg, tokenizer, media
        self.pid: int | None = None
        if _can_fork(cfg):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(write, cfg, tokenizer, media)  # never returns
            os.close(write)
            self.pid, self._pipe = pid, read

    def result(self) -> PreparedData:
        outcome = self._wait()
        if outcome is None:  # no child, or one that did not finish: prepare it here (its errors raised here)
            with collector.running():
                return prepare_data(self.cfg, self.tokenizer, self.media)
        return prepare_data(self.cfg, self.tokenizer, self.media, known=outcome)

    def _wait(self) -> dict | None:
        """The child's outcome (prepare_data's `known`), or None when it had none to give."""
        if self.pid is None:
            return None
        with os.fdopen(self._pipe, "rb") as pipe:
            message = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not message:
            return None
        return json.loads(message)

    def __enter__(self) -> PreparingData:
        return self

    def __exit__(self, *exc) -> None:
        """A child still running when set-up fails or is interrupted is stopped and reaped."""
        if self.pid is not None:
            import signal

            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self._pipe)
            self.pid = None


def _entries(report: dict) -> dict:
    """The cache entries prepare_data read or wrote ({"train": {"cache": ..., "entry": ...}, "eval": ...})."""
    parts = {"train": report, "eval": report.get("eval", {})}
    return {part: {"cache": r["cache"], "entry": r["entry"]} for part, r in parts.items() if "entry" in r}


def _child(write: int, cfg, tokenizer, media) -> None:
    """Prepare the data, tell the parent how the cache went, and leave without the interpreter's teardown."""
    code = 1
    collector.in_child()
    try:
        report = prepare_data(cfg, tokenizer, media).report
        os.write(write, json.dumps(_entries(report)).encode())
        code = 0
    except BaseException:  # noqa: BLE001 - the parent prepares the data itself and raises the error there
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        os._exit(code)
