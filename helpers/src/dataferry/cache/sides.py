"""Where a fill runs: the waits of the fill engine (:mod:`dataferry.cache.fill`), one side per caller.

The engine is one coroutine; a side gives it its waits (the fill lock, the index's answers, pauses),
where its bytes go, and how a finished fill is put in place. The bytes travel by the source's one
transport (:mod:`dataferry.cache.transport`) on either side.

- :class:`OnThread`: a fill a caller waits for (a read's miss, a folder's fill from a pool thread). The
  coroutine runs to its end on the caller's thread (:func:`run_here`), every wait blocking that thread:
  the fill lock waits in the kernel, a bucket's bytes come over the download loop; an object up to
  ``HELD_MAX`` is held in memory and written to its temp file once verified (the read that filled it is
  handed those bytes), a larger one is written into its temp file as it comes.
  A fill on the process's lease (:mod:`dataferry.cache.lease`) is renamed into place at once and made
  durable with its batch by the index writer (one ``syncfs``, before its row is written); one that
  reserved its own room is made durable (``fsync``), then renamed.
- :class:`OnLoop`: a bucket's fills by the hundred (``stage``, fills ahead of a reader), as coroutines on
  the process's download loop (:mod:`dataferry.aio`). Its fill lock is polled, never blocking the loop;
  objects up to ``HELD_MAX`` are held in memory and put in place a group at a time
  (:mod:`dataferry.cache.placing`: one ``syncfs`` per group).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from dataferry import aio
from dataferry.cache.budget import Refusal
from dataferry.cache.index import Index
from dataferry.cache.locks import FillLocks
from dataferry.cache.placing import Placing
from dataferry.cache.requests import Forget, Reserve
from dataferry.cache.store import Row
from dataferry.cache.transport import Sink, fetch_ranges, fetch_whole
from dataferry.sources import Entry, Source, fetches_async

__all__ = ["Side", "OnLoop", "OnThread", "run_here", "HELD_MAX", "Leased"]

HELD_MAX = 256 << 10  # objects up to this size are held in memory until they are put in place (on the loop)

T = TypeVar("T")
Leased = tuple[str, Row]  # a fill on a lease: the lease's key, and the entry's row to record


def run_here(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (every wait of :class:`OnThread` blocks) to its end here."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a fill on the caller's thread waited on an event loop: a bug in dataferry")


class Side(Protocol):
    """What the fill engine needs of the place it runs; ``leases``: whether its fills draw on the
    process's lease."""

    leases: bool

    def hold(self, key: str) -> contextlib.AbstractAsyncContextManager[bool]: ...
    async def reserve(self, row: Row) -> Refusal | None: ...
    async def forget(self, key: str, pid: int) -> None: ...
    async def pause(self, seconds: float) -> None: ...
    def sink(self, tmp: str, size: int) -> Sink: ...
    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]: ...
    async def place(self, sink: Sink, path: str, key: str, crc: str, leased: Leased | None) -> None: ...


class OnThread:
    """Fills run to completion on the caller's thread, every wait blocking it."""

    leases = True

    def __init__(self, locks: FillLocks, index: Index, count: Any) -> None:
        self.locks, self.index, self.count = locks, index, count

    def __repr__(self) -> str:
        return "<OnThread>"

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        with self.locks.hold(key) as waited:  # waits in the kernel
            yield waited

    async def reserve(self, row: Row) -> Refusal | None:
        return self._ask(Reserve(row))

    async def forget(self, key: str, pid: int) -> None:
        self._ask(Forget(key, pid))

    def _ask(self, request: Reserve | Forget) -> Any:
        answer: Future = Future()
        self.index.writer.ask(request, answer)
        return answer.result()

    async def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def sink(self, tmp: str, size: int) -> Sink:
        return Sink(tmp, size, held=size <= HELD_MAX)  # a small object's file is made once it is verified

    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]:
        if fetches_async(source):  # its transport runs on the download loop; this thread waits for it
            return aio.run(fetch_ranges(source, entry, sink, deadline, self.count))
        return fetch_whole(source, entry, sink, deadline, self.count)

    async def place(self, sink: Sink, path: str, key: str, crc: str, leased: Leased | None) -> None:
        """Renamed into place (atomic: readers only ever find whole files there). A fill with its own
        reservation is durable first, then its row marked ready; a fill on the lease (``leased``: its
        lease and its row) is recorded by the index writer once its batch is durable, and keeps its fill
        lock until then. A row only ever names a durable file: a power cut may leave a file no row
        names, partial, which the next open removes as an orphan."""
        sink.write_out()
        if leased is None:
            os.fsync(sink.fd)
        sink.close()
        os.replace(sink.tmp, path)
        if leased is None:
            self.index.writer.ready(crc, time.time(), key)
        else:  # queued before the lock is marked kept: an interrupt between the two frees it early, never leaks it
            self.index.writer.placed(leased[1], leased[0], path, self.locks.unlocker(key))
            self.locks.keep(key)


class OnLoop:
    """Fills of a source with ``fetch_async``, as coroutines on this process's download loop. Their
    reservations share one round trip per turn of the loop, so they draw on no lease."""

    leases = False

    def __init__(self, locks: FillLocks, index: Index, count: Any, tmp_folder: str) -> None:
        self.locks, self.index, self.count = locks, index, count
        self.pid = os.getpid()
        self.placing = Placing(tmp_folder)
        self._held: dict[str, asyncio.Event] = {}  # fill locks held by this loop, by key

    def __repr__(self) -> str:
        return f"<OnLoop holding {len(self._held)} fill locks>"

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        """``key``'s fill lock: awaited while another coroutine here holds it, polled (never blocking
        the loop) while a thread or another process does. Gives whether it had to wait for another."""
        held = self._held
        waited = False
        while key in held:
            waited = True
            await held[key].wait()
        held[key] = released = asyncio.Event()
        try:
            pause = 0.002
            while not self.locks.try_hold(key):
                waited = True
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.05)
            try:
                yield waited
            finally:
                self.locks.release(key)
        finally:
            del held[key]
            released.set()

    async def reserve(self, row: Row) -> Refusal | None:
        return await self._ask(Reserve(row))

    async def forget(self, key: str, pid: int) -> None:
        await self._ask(Forget(key, pid))

    async def _ask(self, request: Reserve | Forget) -> Any:
        answer = asyncio.get_running_loop().create_future()
        self.index.writer.ask(request, answer)
        return await answer

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def sink(self, tmp: str, size: int) -> Sink:
        return Sink(tmp, size, held=size <= HELD_MAX)

    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]:
        return await fetch_ranges(source, entry, sink, deadline, self.count)

    async def place(self, sink: Sink, path: str, key: str, crc: str, leased: Leased | None) -> None:
        """Put in place with the next group (:mod:`dataferry.cache.placing`), its row marked ready."""
        sink.close()
        await self.placing.put(self.index.writer, sink.tmp, path, key, self.pid, crc, sink.held)
