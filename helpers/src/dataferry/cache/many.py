"""Many fills at once: a listing's worth (:func:`fill_many`, what ``stage`` runs) and fills ahead of
a reader (:class:`FillsAhead`, what the prefetching sampler and the shard loader start).

For a bucket, every fill is a coroutine of the one engine on the download loop, handed over in
batches; for a folder, a pool of threads runs the engine's fills on their own threads.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from typing import Any

from dataferry import aio
from dataferry.cache.fill import FillEngine, Filled
from dataferry.cache.layout import key
from dataferry.sources import Entry, Source, fetches_async

__all__ = ["fill_many", "FillsAhead"]


class _Pump:
    """The loop's side of :func:`fill_many`: items arrive in batches, run ``width`` at a
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


def fill_many(engine: FillEngine, source: Source, items: Iterable[Entry | str], width: int) -> Iterator[Filled]:
    """Fill every item, ``width`` at a time, yielding a :class:`Filled` as each ends (in any order).
    ``items`` may be a stream (a listing): it is read as room frees up."""
    if not fetches_async(source):
        yield from _on_threads(engine, source, items, width)
        return
    side = engine.on_loop

    async def one(item: Entry | str) -> Filled:
        entry = item if isinstance(item, Entry) else await asyncio.get_running_loop().run_in_executor(
            None, source.stat, item)
        return await engine.fill(side, source, entry)

    done: queue.SimpleQueue = queue.SimpleQueue()
    pump = _Pump(one, width, done)
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
                yield outcome if error is None else _failed(item, error)
    finally:
        if in_flight:  # the caller stopped early: start nothing more, let the fills under way end
            loop.call_soon_threadsafe(pump.close)
            while in_flight:
                in_flight -= len(done.get())


def _failed(item: Entry | str, error: BaseException) -> Filled:
    if isinstance(item, Entry):
        return Filled(item.name, item.size, error=error, entry=item)
    return Filled(item, 0, error=error)


def _on_threads(engine: FillEngine, source: Source, items: Iterable[Entry | str], width: int) -> Iterator[Filled]:
    def one(item: Entry | str) -> Filled:
        return engine.fill_now(source, item if isinstance(item, Entry) else source.stat(item))

    pending: dict[Future, Entry | str] = {}

    def outcome(fut: Future) -> Filled:
        item = pending.pop(fut)
        try:
            return fut.result()
        except BaseException as e:  # noqa: BLE001 - reported per item; none stops the rest
            return _failed(item, e)

    with ThreadPoolExecutor(width, thread_name_prefix="dataferry-fill") as pool:
        try:
            for item in items:
                pending[pool.submit(one, item)] = item
                if len(pending) >= 2 * width:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        yield outcome(fut)
            for fut in as_completed(list(pending)):
                yield outcome(fut)
        finally:
            for fut in pending:
                fut.cancel()


class FillsAhead:
    """Fills started in the background, ahead of the reads that will want them. For a folder source,
    a pool of this process's threads that grows to the largest width asked for: the fills a caller
    keeps in flight really run at once."""

    def __init__(self, engine: FillEngine) -> None:
        self.engine = engine
        self._mutex = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._width = 0

    def __repr__(self) -> str:
        return f"<FillsAhead {self._width} threads>"

    def start(self, source: Source, items: Sequence[Entry], threads: int) -> list[Future]:
        """Futures that end when the fills are done, each with a list of (name, error) for the fills that
        failed: one for the whole batch on the download loop (one hand-over to it, not one per item), one
        per item on the threads. An item already cached is done here, with one look (a warm epoch's fills
        ahead hand nothing over: that cost its reader's process 59 us a sample, measured)."""
        path = self.engine.layout.object_path
        items = [item for item in items if not os.path.exists(path(key(source, item)))]
        if not items:
            done: Future = Future()
            done.set_result([])
            return [done]
        if fetches_async(source):
            return [aio.submit(self._all(source, list(items)))]
        with self._mutex:
            if self._pool is None or self._width < threads:
                old, self._pool = self._pool, ThreadPoolExecutor(threads, thread_name_prefix="dataferry-fill")
                self._width = threads
                if old is not None:
                    old.shutdown(wait=False)  # its queued fills still run; new ones go to the larger pool
        return [self._pool.submit(self._one, source, item) for item in items]

    def _one(self, source: Source, item: Entry) -> list[tuple[str, BaseException]]:
        try:
            self.engine.fill_now(source, item, ahead=True)
        except Exception as e:  # noqa: BLE001 - the reader's own read raises it properly
            return [(item.name, e)]
        return []

    async def _all(self, source: Source, items: list[Entry]) -> list[tuple[str, BaseException]]:
        side = self.engine.on_loop
        outcomes = await asyncio.gather(*(self.engine.fill(side, source, item, ahead=True) for item in items),
                                        return_exceptions=True)
        return [(item.name, out) for item, out in zip(items, outcomes) if isinstance(out, BaseException)]
