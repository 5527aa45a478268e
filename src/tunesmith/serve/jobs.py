"""One request's generations (its n choices, or its prompts), run in a thread of their own that holds the
request's slot until the last one has stopped, with their events handed to the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from .engine import Engine, Finished, Prepared, TextDelta
from .limits import Slot

_END = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def _post(loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue, item) -> None:
    try:
        loop.call_soon_threadsafe(inbox.put_nowait, item)
    except RuntimeError:  # the loop closed (server shutting down): nobody is listening any more
        pass


class Job:
    """Started at once (not when a response starts reading), so its slot is released even if nobody reads."""

    def __init__(self, engine: Engine, runs: list[Prepared], slot: Slot, stream: bool):
        self.engine, self.runs, self.slot, self.stream = engine, runs, slot, stream
        self.cancel = threading.Event()
        loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.thread = threading.Thread(target=self._work, args=(loop, self.inbox), name="tunesmith-request",
                                       daemon=True)
        self.thread.start()

    async def events(self) -> AsyncIterator[tuple[int, TextDelta | Finished]]:
        """(index of the run, event), in order; cancels what is left if the caller stops reading."""
        try:
            while (item := await self.inbox.get()) is not _END:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            self.cancel.set()

    def _work(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
        try:
            for index, prepared in enumerate(self.runs):
                events = self.engine.run(prepared, stream=self.stream, cancel=self.cancel)
                try:
                    for event in events:
                        if self.cancel.is_set():
                            return
                        _post(loop, inbox, (index, event))
                finally:
                    events.close()  # stops the backend's generation if we left early
        except BaseException as err:
            _post(loop, inbox, _Failed(err))
        finally:
            self.slot.release()
            _post(loop, inbox, _END)
