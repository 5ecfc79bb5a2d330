"""Fills on one event loop: many objects in flight on one thread, and large ones in byte ranges.

For a source with ``fetch_async`` (a GCS bucket), fills run as coroutines on the process's
download loop (:mod:`dataferry.aio`), keeping every promise of :meth:`Cache.fill` at a fraction
of a thread pool's cost on a small machine (issue 10):

- the fill lock is the same lock threads and other processes take, without blocking (one held
  elsewhere is polled; one held by another coroutine here is awaited), so one download per object
  per machine holds across threads, processes and the loop;
- reservations are awaited, batched by the index writer with everyone else's;
- an object of ``RANGE_MIN`` bytes or more comes in ``PART``-sized byte ranges, up to ``RANGES``
  at once, each written in place (``pwrite``) and resumed on its own after a blip; the parts'
  CRC32C are combined and checked against the object's;
- an object under ``HELD_MAX`` bytes is held in memory, not written from the loop; finished fills
  are put in place a group at a time on a worker thread (:mod:`dataferry.cache.placing`: one
  ``syncfs`` per group, then the renames), so a file under ``objects/`` is whole after a crash or a
  power cut, as before.

Sources without ``fetch_async`` (folders) are filled by a pool of threads calling ``fill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from typing import Any

from google.api_core.exceptions import RetryError
from google.api_core.retry_async import AsyncRetry

from dataferry import aio
from dataferry.cache.budget import Refusal
from dataferry.cache.checksum import b64, combine, value
from dataferry.cache.errors import FillTimeout
from dataferry.cache.fill import MIN_FILL_BYTES_PER_S, STALL_S, Hashing, damage, damaged, disk_full, gave_up, source_blip
from dataferry.cache.layout import printable
from dataferry.sources import Attempts, Entry, Source, fetches_async, where

__all__ = ["BulkFilling", "Filled", "RANGE_MIN", "PART", "RANGES", "HELD_MAX"]

RANGE_MIN = 32 << 20  # objects this large come in ranges
PART = 16 << 20
RANGES = 16  # ranges of one object in flight at once
HELD_MAX = 256 << 10  # objects up to this size are held in memory until they are put in place


@dataclass(frozen=True)
class Filled:
    """How one fill of :meth:`BulkFilling.fill_many` ended: ``fetched`` bytes downloaded (0: it
    was cached already, -1: no room, ``refusal`` says why), or the ``error`` it raised."""

    name: str
    size: int
    fetched: int = 0
    refusal: str = ""
    error: BaseException | None = None
    entry: Entry | None = None  # the version filled (None when it could not be looked up)


class _WriteAt:
    """Writes consecutive bytes from ``start`` of ``fd`` (``pwrite``: many ranges of one file at once)."""

    def __init__(self, fd: int, start: int) -> None:
        self.fd, self.at = fd, start

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, self.at)
            view, self.at = view[written:], self.at + written
        return len(data)


class _Held(bytearray):
    """A small object's bytes, held until :class:`~dataferry.cache.placing.Placing` writes them."""

    def write(self, data: bytes) -> int:
        self += data
        return len(data)


class _Part(Hashing):
    """One byte range of an object with its own CRC32C and the fill's deadline, written in place
    into a temp file or appended to the bytes held in memory."""

    def __init__(self, out: int | _Held, start: int, end: int, deadline: float) -> None:
        super().__init__(out if isinstance(out, _Held) else _WriteAt(out, start), deadline)
        self.start, self.end = start, end


class _Pump:
    """The loop's side of :meth:`BulkFilling.fill_many`: items arrive in batches, run ``width`` at a
    time, and their outcomes go back in batches, so the caller's thread wakes once per batch,
    not once per object (each wake-up is a GIL hand-over)."""

    def __init__(self, run: Any, width: int, done: queue.SimpleQueue) -> None:
        self.run, self.width, self.done = run, width, done
        self.gate: asyncio.Semaphore | None = None
        self.results: list[tuple[Any, Any, BaseException | None]] = []
        self.closed = self.flushing = False

    def add(self, batch: list) -> None:
        self.gate = self.gate or asyncio.Semaphore(self.width)
        for item in batch:
            asyncio.ensure_future(self._one(item))

    def close(self) -> None:
        self.closed = True

    async def _one(self, item: Any) -> None:
        assert self.gate is not None
        outcome, error = None, None
        async with self.gate:
            if not self.closed:
                try:
                    outcome = await self.run(item)
                except Exception as e:  # noqa: BLE001 - reported per item; none stops the rest
                    error = e
        self.results.append((item, outcome, error))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_later(0.01, self._flush)

    def _flush(self) -> None:
        self.flushing = False
        results, self.results = self.results, []
        self.done.put(results)


class BulkFilling:
    """The :class:`~dataferry.cache.Cache` methods that fill many objects at once."""

    def fill_many(self, source: Source, items: Iterable[Entry | str], width: int = 64) -> Iterator[Filled]:
        """Fill every item, ``width`` at a time, yielding a :class:`Filled` as each ends (in any
        order). ``items`` may be a stream (a listing): it is read as room frees up."""
        if not fetches_async(source):
            yield from self._fill_many_threads(source, items, width)
            return
        done: queue.SimpleQueue = queue.SimpleQueue()
        pump = _Pump(lambda item: self._fill_async(source, item), width, done)
        loop, window, in_flight = aio.loop(), 4 * width, 0
        items = iter(items)
        try:
            while True:
                batch = list(itertools.islice(items, window - in_flight))
                if batch:
                    loop.call_soon_threadsafe(pump.add, batch)
                    in_flight += len(batch)
                if not in_flight:
                    return
                for item, outcome, error in done.get():
                    in_flight -= 1
                    yield self._filled(item, outcome, error)
        finally:
            if in_flight:  # the caller stopped early: start nothing more, let the fills under way end
                loop.call_soon_threadsafe(pump.close)
                while in_flight:
                    in_flight -= len(done.get())

    def _fill_many_threads(self, source: Source, items: Iterable[Entry | str], width: int) -> Iterator[Filled]:
        pending: dict[Future, Entry | str] = {}
        with ThreadPoolExecutor(width, thread_name_prefix="dataferry-fill") as pool:
            try:
                for item in items:
                    pending[pool.submit(self._fill_one, source, item)] = item
                    if len(pending) >= 2 * width:
                        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            yield self._filled_future(pending.pop(fut), fut)
                for fut in as_completed(list(pending)):
                    yield self._filled_future(pending.pop(fut), fut)
            finally:
                for fut in pending:
                    fut.cancel()

    def fill_later(self, source: Source, items: Sequence[Entry], threads: int = 32) -> list[Future]:
        """Start filling ``items`` in the background. Returns futures that end when they are done,
        each with a list of (name, error) for the fills that failed: one for the whole batch on the
        download loop (one hand-over to it, not one per item), one per item on a pool of this
        process's threads for a source without ``fetch_async`` (a folder: Drive, a gcsfuse mount), which
        grows to the largest ``threads`` asked for: the fills a caller keeps in flight really run at once."""
        if fetches_async(source):
            return [aio.submit(self._fill_all_async(source, list(items)))]
        with self._mutex:
            if self._fill_threads is None or self._fill_width < threads:
                old, self._fill_threads = self._fill_threads, ThreadPoolExecutor(threads, thread_name_prefix="dataferry-fill")
                self._fill_width = threads
                if old is not None:
                    old.shutdown(wait=False)  # its queued fills still run; new ones go to the larger pool
        return [self._fill_threads.submit(self._failures, source, [item]) for item in items]

    def _failures(self, source: Source, items: list[Entry]) -> list[tuple[str, BaseException]]:
        failed = []
        for item in items:
            try:
                self._fill(source, item, ahead=True)
            except Exception as e:  # noqa: BLE001 - the reader's own read raises it properly
                failed.append((item.name, e))
        return failed

    async def _fill_all_async(self, source: Source, items: list[Entry]) -> list[tuple[str, BaseException]]:
        """:meth:`fill_later`'s batch: fills ahead of a reader."""
        outcomes = await asyncio.gather(*(self._fill_async(source, item, ahead=True) for item in items),
                                        return_exceptions=True)
        return [(item.name, out) for item, out in zip(items, outcomes) if isinstance(out, BaseException)]

    @staticmethod
    def _filled(item: Entry | str, outcome: tuple[int, str, Entry] | None, error: BaseException | None) -> Filled:
        name = item.name if isinstance(item, Entry) else item
        if error is not None or outcome is None:
            return Filled(name, item.size if isinstance(item, Entry) else 0, error=error)
        fetched, refusal, entry = outcome
        return Filled(name, entry.size, fetched, refusal, entry=entry)

    def _filled_future(self, item: Entry | str, fut: Future) -> Filled:
        try:
            return self._filled(item, fut.result(), None)
        except BaseException as e:  # noqa: BLE001 - reported per item; none stops the rest
            return self._filled(item, None, e)

    def _fill_one(self, source: Source, item: Entry | str) -> tuple[int, str, Entry]:
        entry = self._entry(source, item)
        fetched = self.fill(source, entry)
        return fetched, self.last_refusal if fetched < 0 else "", entry

    # -- one fill, as a coroutine ----------------------------------------------------------------

    async def _fill_async(self, source: Source, item: Entry | str, ahead: bool = False) -> tuple[int, str, Entry]:
        """:meth:`fill` on the download loop: (bytes fetched, why there was no room, the entry). A fill ``ahead``
        of a reader that waited for someone else's fill of the same object and then finds it gone does
        nothing: that fill was for its own read, which happened, and the object was evicted since."""
        entry = item if isinstance(item, Entry) else await asyncio.get_running_loop().run_in_executor(
            None, source.stat, item)
        key = self.key(source, entry)
        path = self._object_path(key)
        if os.path.exists(path):
            return 0, "", entry
        t0 = time.perf_counter()
        async with self._fill_lock_async(key) as waited:
            self._count(wait_s=time.perf_counter() - t0)
            if os.path.exists(path) or (ahead and waited):
                return 0, "", entry
            self._count(misses=1)
            refusal = await self._reserve_async(source, entry, key)
            if refusal is not None:
                return -1, refusal.why, entry
            tmp = f"{self._tmp}/{key}.{self._pid}.part"
            t0 = time.perf_counter()
            held = _Held() if entry.size <= HELD_MAX else None
            try:
                if held is not None:
                    crc = await self._download_async(source, entry, held)
                else:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        crc = await self._download_async(source, entry, fd)
                    finally:
                        os.close(fd)
            except BaseException as e:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                self._index.forget(key)  # queued, so the loop never waits on the index here
                return self._failed(e, entry)
            try:  # from here the temp file and the row are the group's to finish or undo
                await self._placing.put(self._index, tmp, path, key, crc, held)
            except OSError as e:
                return self._failed(e, entry)
        self._count(bytes_from_source=entry.size, fetch_s=time.perf_counter() - t0)
        return entry.size, "", entry

    def _failed(self, e: BaseException, entry: Entry) -> tuple[int, str, Entry]:
        """A fill that failed: a refusal if the cache's disk filled up, else ``e`` raised."""
        if disk_full(e):
            return -1, f"the cache's disk filled up during the download ({self._free()})", entry
        raise e

    @contextlib.asynccontextmanager
    async def _fill_lock_async(self, key: str) -> AsyncIterator[bool]:
        """``key``'s fill lock, for a coroutine: awaited while another coroutine here holds it,
        polled (never blocking the loop) while a thread or another process does. Gives whether it
        had to wait for another."""
        held = self._held
        waited = False
        while key in held:
            waited = True
            await held[key].wait()
        held[key] = released = asyncio.Event()
        try:
            pause = 0.002
            while not self._fill_locks.try_hold(key):
                waited = True
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.05)
            try:
                yield waited
            finally:
                self._fill_locks.release(key)
        finally:
            del held[key]
            released.set()

    async def _reserve_async(self, source: Source, entry: Entry, key: str) -> Refusal | None:
        """:meth:`_reserve` for a coroutine: the answer is awaited, and so is room held by others."""
        for pause in self._room_waits(entry):
            try:
                refusal = await self._index.reserve_async(self._reservation(source, entry, key))
            except sqlite3.OperationalError as e:
                refusal = self._index_full(e)
            if refusal is None or not refusal.transient or pause is None:
                return refusal
            await asyncio.sleep(pause)
        return self._too_big(entry)

    # -- the bytes --------------------------------------------------------------------------------

    async def _download_async(self, source: Source, entry: Entry, out: int | _Held) -> str:
        """Download into file ``out`` in place (ranges for a large object) or into the bytes held,
        verify, refetch when damaged; returns the CRC32C. Bounded like :meth:`_download` by
        ``retry_deadline_s`` or a second per MB."""
        limit = max(self.retry_deadline_s, entry.size / MIN_FILL_BYTES_PER_S)
        deadline = time.monotonic() + limit
        step = PART if entry.size >= RANGE_MIN else max(entry.size, 1)
        bounds = [(start, min(start + step, entry.size)) for start in range(0, max(entry.size, 1), step)]
        for attempt in range(self.max_refetches + 1):
            if attempt:
                if isinstance(out, _Held):
                    out.clear()
                else:
                    os.ftruncate(out, 0)
                self._count(refetches=1)
            parts = [_Part(out, start, end, deadline) for start, end in bounds]
            if len(parts) == 1:
                await self._range(source, entry, parts[0])
            else:
                await self._ranges(source, entry, parts)
            n, crc = parts[0].n, value(parts[0].crc)
            for part in parts[1:]:
                crc, n = combine(crc, value(part.crc), part.n), n + part.n
            got = b64(crc)
            why = damage(entry, n, got)
            if not why:
                return got
        raise damaged(where(source, printable(entry.name)), why, self.max_refetches + 1)

    async def _ranges(self, source: Source, entry: Entry, parts: list[_Part]) -> None:
        """The parts of a large object, ``RANGES`` at a time; the first to fail cancels the rest."""
        gate = asyncio.Semaphore(RANGES)

        async def one(part: _Part) -> None:
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

    async def _range(self, source: Source, entry: Entry, part: _Part) -> None:
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
            self._count(retries=1)

        on_error(first)
        try:
            if time.monotonic() >= part.deadline:
                raise RetryError("the deadline passed", first) from first
            await AsyncRetry(predicate=source_blip, initial=0.1, maximum=5.0, multiplier=2.0,
                             timeout=max(part.deadline - time.monotonic(), 0.0), on_error=on_error)(_attempt)(
                source, entry, part)
        except (RetryError, FillTimeout) as e:
            raise gave_up(where(source, printable(entry.name)), attempts, e) from (
                e.cause if isinstance(e, RetryError) else e)


async def _attempt(source: Source, entry: Entry, part: _Part) -> None:
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
