"""The fill engine: one object from its source into the cache, verified, crash-safe, within a deadline.

One coroutine, :meth:`FillEngine.fill`, holds every rule of a fill, whatever the source:

- one download per object per machine: the fill lock, and a look for the file after it is held;
- room under the budget: drawn on the process's lease (:mod:`dataferry.cache.lease`) by a side that
  leases, or a reservation the index writer decides, waited for a while when readers or fills in
  flight hold the room, refused when the object cannot fit (the read then streams);
- the bytes, with the source's retries (resuming), checked for size and CRC32C and fetched again
  when damaged, the whole fill bounded by ``retry_deadline_s`` (or a second per MB, if longer);
- into place: renamed into ``objects/`` once verified, so a reader only ever finds whole files there,
  and named by an index row only once durable (:mod:`dataferry.cache.sides`); a fill that
  fails removes its temp file and its reservation before it lets go of the lock, and a disk that
  fills up turns into a refusal.

Where it runs is a side (:mod:`dataferry.cache.sides`): to its end on the thread of a caller that waits
for it (the synchronous calls run this same coroutine), or by the hundred on the download loop for a
bucket. The bytes travel by the source's one transport (:mod:`dataferry.cache.transport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field

from dataferry.cache.budget import Refusal
from dataferry.cache.checksum import b64
from dataferry.cache.counters import Counters
from dataferry.cache.errors import DamagedAtSource, disk_full
from dataferry.cache.index import Index
from dataferry.cache.layout import key, printable
from dataferry.cache.locks import FillLocks
from dataferry.cache.sides import OnLoop, OnThread, Side, run_here
from dataferry.cache.store import Row
from dataferry.cache.transport import Sink
from dataferry.sources import Entry, Source, where

__all__ = ["FillEngine", "Filled", "MIN_FILL_BYTES_PER_S"]

MIN_FILL_BYTES_PER_S = 1e6  # a fill may take retry_deadline_s, or a second per MB if that is longer
_ON_THIS_THREAD = threading.local()  # how many fills run on this thread now (one inside another's fetch)


@dataclass(frozen=True)
class Filled:
    """How one fill ended: ``fetched`` bytes downloaded (0: it was cached already, -1: no room,
    ``refusal`` says why), or the ``error`` it raised (from :meth:`~dataferry.Cache.fill_many`; a
    single :meth:`~dataferry.Cache.fill` raises it); ``crc32c`` of the bytes it downloaded; ``data``, those
    bytes, verified, when the caller asked to keep them and they were small enough to be held in memory."""

    name: str
    size: int
    fetched: int = 0
    refusal: str = ""
    error: BaseException | None = None
    entry: Entry | None = None  # the version filled (None when it could not be looked up)
    crc32c: str = ""
    data: bytes | None = field(default=None, repr=False)  # the verified bytes, for a fill_now(keep=True) that held them


def damage(entry: Entry, n: int, crc: str) -> str:
    """What is wrong with ``n`` bytes of checksum ``crc`` as a copy of ``entry`` ("" if nothing)."""
    if n != entry.size:
        return f"got {n} bytes, expected {entry.size}"
    if entry.crc32c and crc != entry.crc32c:
        return f"crc32c {crc}, expected {entry.crc32c}"
    return ""


class FillEngine:
    """Fills of one cache folder in this process (a forked child makes its own)."""

    def __init__(self, index: Index, counters: Counters, locks: FillLocks, *, max_refetches: int,
                 retry_deadline_s: float) -> None:
        self.layout, self.budget, self.lease, self.count = index.layout, index.budget, index.lease, counters.add
        self.max_refetches, self.retry_deadline_s = max_refetches, retry_deadline_s
        self.pid = os.getpid()
        self.on_thread = OnThread(locks, index, counters.add)
        self.on_loop = OnLoop(locks, index, counters.add, index.layout.objects)

    def __repr__(self) -> str:
        return f"<FillEngine {self.layout.root}>"

    def fill_now(self, source: Source, entry: Entry, ahead: bool = False, keep: bool = False) -> Filled:
        """:meth:`fill`, run to its end on this thread; ``keep``: with the bytes it fetched, verified, if it held
        them (a read that missed needs not read its copy back). A fill started while another runs on this thread
        (the JPEG a decode-once fill reads) does not wait for room: what it would wait for may be held by that
        very fill, so when there is no room now it is refused at once (and its read streams)."""
        outer = getattr(_ON_THIS_THREAD, "fills", 0)
        _ON_THIS_THREAD.fills = outer + 1
        try:
            return run_here(self.fill(self.on_thread, source, entry, ahead, patient=not outer, keep=keep))
        finally:
            _ON_THIS_THREAD.fills = outer

    def stream_now(self, source: Source, entry: Entry) -> bytes:
        """:meth:`stream`, run to its end on this thread."""
        return run_here(self.stream(self.on_thread, source, entry))

    async def fill(self, side: Side, source: Source, entry: Entry, ahead: bool = False, patient: bool = True,
                   keep: bool = False) -> Filled:
        """Make sure ``entry`` is cached. A fill ``ahead`` of a reader that waited for someone else's fill
        of the same object does nothing after it: that fill was for its own read, which happened. One that is
        not ``patient`` takes the room there is now, or none; one asked to ``keep`` its bytes gives them if it
        held them."""
        k = key(source, entry)
        path = self.layout.object_path(k)
        cached = Filled(entry.name, entry.size, entry=entry)
        if os.path.exists(path):
            return cached
        t0 = time.perf_counter()
        async with side.hold(k) as waited:
            self.count(wait_s=time.perf_counter() - t0)
            if os.path.exists(path) or (ahead and waited):
                return cached
            self.count(misses=1)
            lease = self.lease.draw(entry.size) if side.leases else None
            if lease is None:
                refusal = await self._reserve(side, source, entry, k, patient)
                if refusal is not None:
                    return Filled(entry.name, entry.size, -1, refusal.why, entry=entry)
            t0 = time.perf_counter()
            sink = None
            try:
                sink = side.sink(self.layout.temp_path(k, self.pid), entry.size)
                crc = await self._bytes(side, source, entry, sink)
            except BaseException as e:
                return await self._undo(side, k, sink, e, entry, lease)
            try:
                await side.place(sink, path, k, crc, None if lease is None else (lease, self._row(source, entry, k, crc)))
            except (asyncio.CancelledError, GeneratorExit):
                raise  # the group it joined puts it in place, or undoes it
            except BaseException as e:
                return await self._undo(side, k, sink, e, entry, lease)
        self.count(bytes_from_source=entry.size, fetch_s=time.perf_counter() - t0)
        data = bytes(sink.held) if keep and sink.held is not None else None
        return Filled(entry.name, entry.size, entry.size, entry=entry, crc32c=crc, data=data)

    def _row(self, source: Source, entry: Entry, k: str, crc: str | None) -> Row:
        """The fill's entry: without a CRC32C, as its reservation; with one, ready, as a leased fill is recorded."""
        now = time.time()
        return Row(k, source.uri, printable(entry.name), entry.version, entry.size, crc, self.pid, now, now)

    async def stream(self, side: Side, source: Source, entry: Entry) -> bytes:
        """The object's bytes straight from the source, checked like a fill's, kept nowhere."""
        sink = Sink("", entry.size, held=True)
        await self._bytes(side, source, entry, sink)
        self.count(streamed=1, bytes_from_source=entry.size)
        return bytes(sink.held or b"")

    async def _reserve(self, side: Side, source: Source, entry: Entry, k: str, patient: bool) -> Refusal | None:
        """Record the fill in progress; while the room is held by readers or fills in flight, wait for it
        (up to ``ROOM_WAIT_S``; not at all unless ``patient``). None when reserved, else why not."""
        for pause in self.budget.room_waits(entry, patient):
            try:
                refusal = await side.reserve(self._row(source, entry, k, None))
            except sqlite3.OperationalError as e:
                refusal = self.budget.index_full(e)
            if refusal is None or not refusal.transient or pause is None:
                return refusal
            await side.pause(pause)
        return self.budget.too_big(entry)

    async def _bytes(self, side: Side, source: Source, entry: Entry, sink: Sink) -> str:
        """Every byte into ``sink``, checked, fetched again while damaged; returns the CRC32C."""
        deadline = time.monotonic() + max(self.retry_deadline_s, entry.size / MIN_FILL_BYTES_PER_S)
        for attempt in range(self.max_refetches + 1):
            if attempt:
                sink.restart()
                self.count(refetches=1)
            n, crc = await side.fetch(source, entry, sink, deadline)
            got = b64(crc)
            why = damage(entry, n, got)
            if not why:
                return got
        raise DamagedAtSource(f"{where(source, printable(entry.name))}: {why} after {self.max_refetches + 1} downloads; "
                              "the object or the connection is damaged. Nothing was cached.")

    async def _undo(self, side: Side, k: str, sink: Sink | None, e: BaseException, entry: Entry,
                    lease: str | None) -> Filled:
        """A fill that failed: its temp file and its reservation (or the room it drew on the lease) go,
        before its lock does, so that no later fill's row is taken for it; a refusal if the cache's disk
        filled up, else ``e`` raised."""
        if sink is not None:
            sink.drop()
        if lease is not None:
            self.lease.give_back(entry.size)
        if isinstance(e, GeneratorExit):  # a coroutine closed mid-way may not wait: its row goes once this process ends
            raise e
        with contextlib.suppress(Exception):  # a disk too full to drop the row drops it with a later batch
            if lease is None:
                await side.forget(k, self.pid)
        if disk_full(e):
            return Filled(entry.name, entry.size, -1, f"the cache's disk filled up during the download "
                                                       f"({self.budget.free()})", entry=entry)
        raise e
