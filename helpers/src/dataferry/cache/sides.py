"""Where a fill runs, and how its bytes travel: one side per kind of source.

The fill engine (:mod:`dataferry.cache.fill`) is one coroutine; a side gives it its waits (the fill
lock, the index's answers, pauses) and its transport (the bytes, retried and resumed, and the move
into place):

- :class:`OnLoop`, for a source with ``fetch_async`` (a bucket): fills are coroutines on the
  process's download loop (:mod:`dataferry.aio`), hundreds in flight on one thread. An object of
  ``RANGE_MIN`` bytes or more comes in ``PART``-sized byte ranges, ``RANGES`` at once, each resumed
  on its own after a blip; objects up to ``HELD_MAX`` are held in memory and put in place a group at
  a time (:mod:`dataferry.cache.placing`: one ``syncfs`` per group). Its fill lock is polled, never
  blocking the loop.
- :class:`OnThread`, for any other source (a folder: local disk, Drive, a gcsfuse mount): the
  coroutine runs to its end on the caller's thread (:func:`run_here`), every wait blocking that
  thread; a fill writes its temp file, ``fsync``\\s it and renames it into place.

Both retry with the sources' one policy (:func:`~dataferry.sources.retry_policy`), resume from the
bytes they have, keep the fill's deadline however slowly bytes trickle in, and never retry an error
of the cache's own disk as if the network had failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Protocol, TypeVar

import google_crc32c
from google.api_core.exceptions import RetryError

from dataferry import aio
from dataferry.cache.budget import Refusal
from dataferry.cache.checksum import combine, value
from dataferry.cache.errors import CacheFolderError, FillTimeout
from dataferry.cache.index import Index
from dataferry.cache.layout import printable
from dataferry.cache.locks import FillLocks
from dataferry.cache.placing import Placing
from dataferry.sources import (Attempts, Entry, Source, SourceError, is_transient, retry_policy, retry_policy_async,
                               where)

__all__ = ["Side", "OnLoop", "OnThread", "Sink", "run_here", "RANGE_MIN", "PART", "RANGES", "HELD_MAX", "STALL_S"]

STALL_S = 30.0  # the longest wait for the next byte of a download before it is retried
RANGE_MIN = 32 << 20  # objects this large come in ranges (on the loop)
PART = 16 << 20
RANGES = 16  # ranges of one object in flight at once
HELD_MAX = 256 << 10  # objects up to this size are held in memory until they are put in place (on the loop)

T = TypeVar("T")


def run_here(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (every wait of :class:`OnThread` blocks) to its end here."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a fill on the caller's thread waited on an event loop: a bug in dataferry")


class Sink:
    """Where one fill's bytes go: written in place into its temp file (``fd``), or held in memory
    (``held``, preallocated, each range written at its offset)."""

    def __init__(self, tmp: str, size: int, held: bool) -> None:
        self.tmp, self.fd = tmp, -1
        self.held = bytearray(size) if held else None
        if not held:
            try:
                self.fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                raise CacheFolderError.writing(e) from e

    def __repr__(self) -> str:
        return f"<Sink {'held' if self.held is not None else self.tmp}>"

    def restart(self) -> None:
        """Before a refetch: the bytes so far go."""
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def drop(self) -> None:
        """A failed fill: close and remove the temp file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


class Part:
    """One byte range of a fill (``start``..``end``), written at its offset with its own CRC32C and byte
    count; past ``deadline`` (a ``time.monotonic()`` value) it refuses more, so a trickling link cannot
    outlast the fill's deadline."""

    def __init__(self, sink: Sink, start: int, end: int, deadline: float) -> None:
        self.sink, self.start, self.end, self.deadline = sink, start, end, deadline
        self.n, self.crc = 0, google_crc32c.Checksum()

    def write(self, data: bytes) -> int:
        if time.monotonic() > self.deadline:
            raise FillTimeout(f"the deadline passed with {self.n} bytes received")
        at = self.start + self.n
        if self.sink.held is not None:
            self.sink.held[at:at + len(data)] = data
        else:
            try:
                view = memoryview(data)
                while view:
                    written = os.pwrite(self.sink.fd, view, at)
                    view, at = view[written:], at + written
            except OSError as e:
                raise CacheFolderError.writing(e) from e
        self.crc.update(data)
        self.n += len(data)
        return len(data)


def source_blip(exc: BaseException) -> bool:
    """Worth retrying: a transient error of the source, never one of the cache's own disk, nor a deadline."""
    return not isinstance(exc, (CacheFolderError, FillTimeout)) and is_transient(exc)


def gave_up(name: str, attempts: Attempts, e: RetryError | FillTimeout) -> SourceError:
    """The error of a download that kept failing (the retry deadline) or did not finish in time."""
    if isinstance(e, RetryError):
        return SourceError(f"{attempts.gave_up(f'{name}: the source', e.cause)}; nothing was cached.")
    return SourceError(f"{attempts.gave_up(f'{name}: the download did not finish', e, 'within')}; nothing was cached.")


class Side(Protocol):
    """What the fill engine needs of the place it runs."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T: ...
    def hold(self, key: str) -> contextlib.AbstractAsyncContextManager[bool]: ...
    async def reserve(self, row: tuple) -> Refusal | None: ...
    async def forget(self, key: str, pid: int) -> None: ...
    async def pause(self, seconds: float) -> None: ...
    def sink(self, tmp: str, size: int) -> Sink: ...
    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]: ...
    async def place(self, sink: Sink, path: str, key: str, crc: str) -> None: ...


@functools.lru_cache(maxsize=64)
def _fetch_takes_timeout(cls: Any) -> bool:
    return "timeout" in inspect.signature(cls.fetch).parameters


class OnThread:
    """Fills of a source without ``fetch_async``, run to completion on the caller's thread."""

    def __init__(self, locks: FillLocks, index: Index, count: Any) -> None:
        self.locks, self.index, self.count = locks, index, count

    def __repr__(self) -> str:
        return "<OnThread>"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_here(coro)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[bool]:
        with self.locks.hold(key) as waited:  # waits in the kernel
            yield waited

    async def reserve(self, row: tuple) -> Refusal | None:
        return self.index.writer.reserve(row)

    async def forget(self, key: str, pid: int) -> None:
        self.index.writer.forget(key, pid).result()

    async def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def sink(self, tmp: str, size: int) -> Sink:
        return Sink(tmp, size, held=False)

    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]:
        """Every byte in one part, resumed from the bytes it has after each blip."""
        part = Part(sink, 0, entry.size, deadline)
        attempts = Attempts()
        timed = _fetch_takes_timeout(type(source))

        def on_error(exc: BaseException) -> None:
            attempts(exc)
            self.count(retries=1)

        def attempt() -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FillTimeout(f"the deadline passed with {part.n} bytes received")
            if part.n < entry.size or entry.size == 0:
                if timed:
                    source.fetch(entry, part, start=part.n, timeout=min(STALL_S, left))  # type: ignore[arg-type]
                else:  # a Source written before fetch() took a timeout: the part still keeps the deadline
                    source.fetch(entry, part, start=part.n)  # type: ignore[arg-type]

        try:
            retry_policy(max(deadline - time.monotonic(), 0.0), on_error, predicate=source_blip)(attempt)()
        except (RetryError, FillTimeout) as e:
            raise gave_up(where(source, printable(entry.name)), attempts, e) from (
                e.cause if isinstance(e, RetryError) else e)
        return part.n, value(part.crc)

    async def place(self, sink: Sink, path: str, key: str, crc: str) -> None:
        """Durable, then renamed into place (atomic: ``objects/`` only ever holds whole files; the
        folder is not fsynced, so after a power cut a just-renamed file may be missing, never
        partial), then its row marked ready."""
        os.fsync(sink.fd)
        sink.close()
        os.replace(sink.tmp, path)
        self.index.writer.ready(crc, time.time(), key)


class OnLoop:
    """Fills of a source with ``fetch_async``, as coroutines on this process's download loop."""

    def __init__(self, locks: FillLocks, index: Index, count: Any, tmp_folder: str) -> None:
        self.locks, self.index, self.count = locks, index, count
        self.placing = Placing(tmp_folder)
        self._held: dict[str, asyncio.Event] = {}  # fill locks held by this loop, by key

    def __repr__(self) -> str:
        return f"<OnLoop holding {len(self._held)} fill locks>"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return aio.run(coro)

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

    async def reserve(self, row: tuple) -> Refusal | None:
        return await self.index.writer.reserve_async(row)

    async def forget(self, key: str, pid: int) -> None:
        await self.index.writer.forget_async(key, pid)

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def sink(self, tmp: str, size: int) -> Sink:
        return Sink(tmp, size, held=size <= HELD_MAX)

    async def fetch(self, source: Source, entry: Entry, sink: Sink, deadline: float) -> tuple[int, int]:
        """Every byte, in ranges for a large object (``RANGES`` at a time; the first to fail cancels
        the rest); the parts' CRC32C combined."""
        step = PART if entry.size >= RANGE_MIN else max(entry.size, 1)
        parts = [Part(sink, start, min(start + step, entry.size), deadline)
                 for start in range(0, max(entry.size, 1), step)]
        if len(parts) == 1:
            await self._range(source, entry, parts[0])
        else:
            gate = asyncio.Semaphore(RANGES)

            async def one(part: Part) -> None:
                async with gate:
                    await self._range(source, entry, part)

            tasks = [asyncio.ensure_future(one(part)) for part in parts]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        n, crc = parts[0].n, value(parts[0].crc)
        for part in parts[1:]:
            crc, n = combine(crc, value(part.crc), part.n), n + part.n
        return n, crc

    async def _range(self, source: Source, entry: Entry, part: Part) -> None:
        """One byte range, retried (resuming from the bytes it has) while the source blips. Most
        ranges need one attempt: the retry machinery is made only for those that do not."""
        attempts = Attempts()
        try:
            return await _attempt(source, entry, part)
        except FillTimeout as e:
            raise gave_up(where(source, printable(entry.name)), attempts, e) from e
        except Exception as e:  # noqa: BLE001 - a blip goes on to the retry policy, anything else is raised
            if not source_blip(e):
                raise
            first = e

        def on_error(exc: BaseException) -> None:
            attempts(exc)
            self.count(retries=1)

        on_error(first)
        try:
            if time.monotonic() >= part.deadline:
                raise RetryError("the deadline passed", first) from first
            await retry_policy_async(max(part.deadline - time.monotonic(), 0.0), on_error,
                                     predicate=source_blip)(_attempt)(source, entry, part)
        except (RetryError, FillTimeout) as e:
            raise gave_up(where(source, printable(entry.name)), attempts, e) from (
                e.cause if isinstance(e, RetryError) else e)

    async def place(self, sink: Sink, path: str, key: str, crc: str) -> None:
        """Put in place with the next group (:mod:`dataferry.cache.placing`), its row marked ready."""
        sink.close()
        await self.placing.put(self.index.writer, sink.tmp, path, key, crc, sink.held)


async def _attempt(source: Any, entry: Entry, part: Part) -> None:
    """One request for the bytes of ``part`` it does not have yet; the deadline holds however
    slowly bytes trickle in."""
    left = part.deadline - time.monotonic()
    if left <= 0:
        raise FillTimeout(f"the deadline passed with {part.n} bytes of a range received")
    want = part.end - part.start
    if part.n < want or want == 0:
        try:
            await source.fetch_async(entry, part, part.start + part.n, part.end, timeout=min(STALL_S, left),
                                     total=left + 0.5)
        except TimeoutError:
            if time.monotonic() < part.deadline:
                raise  # a stall, retried
            raise FillTimeout(f"the deadline passed with {part.n} bytes of a range received") from None
        if part.n < want:
            raise ConnectionError(f"the connection closed after {part.n} of {want} bytes")
