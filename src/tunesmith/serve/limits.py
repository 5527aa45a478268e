"""The server's limits: request body size, requests generating at once, requests waiting for a slot."""

from __future__ import annotations

import asyncio

from .errors import BusyError, RequestError


async def read_body(request, max_bytes: int) -> bytes:
    """The request body, refused (413) as soon as it passes `max_bytes`, before it is all read."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes, at_least=True)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, max_bytes: int, at_least: bool = False) -> RequestError:
    return RequestError(f"The request body is {'over ' if at_least else ''}{size / 1e6:.1f} MB; this server takes "
                        f"at most {max_bytes / 1e6:g} MB (max_request_mb). Send smaller or fewer images.",
                        status=413, code="request_too_large")


class Slot:
    """A held generation slot; release() may be called from any thread, more than once."""

    def __init__(self, limiter: "Limiter", loop: asyncio.AbstractEventLoop):
        self.limiter, self.loop, self.released = limiter, loop, False

    def release(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # the loop closed: the server is gone, and its limits with it
            pass

    def _release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter.semaphore.release()


class Limiter:
    """At most `max_concurrent` requests generate; up to `max_queue` more wait (in arrival order); one more is
    refused with 429."""

    def __init__(self, max_concurrent: int, max_queue: int):
        self.max_concurrent, self.max_queue = max_concurrent, max_queue
        self.waiting = 0
        self._semaphore: asyncio.Semaphore | None = None

    @property
    def semaphore(self) -> asyncio.Semaphore:
        if self._semaphore is None:  # made in the server's event loop
            self._semaphore = asyncio.Semaphore(self.max_concurrent)
        return self._semaphore

    @property
    def running(self) -> int:
        return self.max_concurrent - self.semaphore._value

    async def acquire(self) -> Slot:
        if self.semaphore.locked() and self.waiting >= self.max_queue:
            raise BusyError(self.waiting, self.max_concurrent)
        self.waiting += 1
        try:
            await self.semaphore.acquire()
        finally:
            self.waiting -= 1
        return Slot(self, asyncio.get_running_loop())
