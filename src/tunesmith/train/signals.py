"""SIGTERM / first Ctrl-C ask for a checkpoint and a clean exit at the next step boundary; a second one aborts.

A stop signal usually reaches a process more than once: `timeout`, a batch scheduler or
Ctrl-C signal the whole process group, and under torchrun the launcher forwards the
signal it got to every rank as well. Copies that arrive within DUPLICATE_S of the first
are the same request; a signal after that aborts (KeyboardInterrupt). DataLoader workers
ignore both signals (train/plan.py), so the step in flight can finish and the save never
needs them. Under torchrun the Runner agrees on the stop across ranks before saving.
"""

from __future__ import annotations

import logging
import signal
import time

log = logging.getLogger("tunesmith")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUPLICATE_S = 1.0  # copies of one request (process group + torchrun's forward) arrive within milliseconds


class StopFlag:
    def __init__(self):
        self.requested = False
        self._first = 0.0
        self._old = {}

    def __enter__(self):
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        now = time.monotonic()
        if not self.requested:
            self.requested, self._first = True, now
            log.warning("stop requested (%s): saving a checkpoint after this step (Ctrl-C again to abort)",
                        signal.Signals(signum).name)
        elif now - self._first >= DUPLICATE_S:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
