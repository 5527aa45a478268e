"""SIGTERM / first Ctrl-C ask for a checkpoint and a clean exit; a second Ctrl-C aborts."""

from __future__ import annotations

import logging
import signal

log = logging.getLogger("tunesmith")


class StopFlag:
    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested: saving a checkpoint after this step (Ctrl-C again to abort)")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
