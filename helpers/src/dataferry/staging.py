"""Moving many objects into a cache: parallel staging and prefetch ahead of a reader.

``stage`` copies a whole source (or a list of names) into a cache with many threads, so
per-request latency overlaps; with ``rank``/``world_size`` each of N processes stages its share.
``Prefetcher`` fills the items of a known order ahead of a reader in the background.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from dataferry.cache import Cache
from dataferry.errors import BadArgument
from dataferry.progress import progress_bar
from dataferry.sources import Entry, NotFoundAtSource, Source, fetches_async

__all__ = ["stage", "StageReport", "Prefetcher", "DEFAULT_WORKERS", "BUCKET_IN_FLIGHT", "width_for", "shard_of"]

DEFAULT_WORKERS = 32  # threads reading a folder (a Drive or gcsfuse mount) at once
BUCKET_IN_FLIGHT = 256  # a bucket's downloads in flight at once: coroutines on one thread, not threads


def width_for(source: Source) -> int:
    """How many fills :func:`stage` runs at once by default for ``source``."""
    return BUCKET_IN_FLIGHT if fetches_async(source) else DEFAULT_WORKERS


MAX_IN_FLIGHT = 4096  # more fills at once than any disk or connection pool serves (a thread each, from a folder)


def _width(source: Source, workers: int | None, in_flight: int | None) -> int:
    """How many fills :func:`stage` runs at once: ``in_flight``, or the older ``workers`` (questioned when it
    caps a bucket below its default), or :func:`width_for` the source."""
    if workers is not None and in_flight is not None:
        raise BadArgument(f"workers={workers!r} and in_flight={in_flight!r}: give in_flight, not both")
    name, width = ("workers", workers) if workers is not None else ("in_flight", in_flight)
    if width is None:
        return width_for(source)
    if type(width) is not int or not 1 <= width <= MAX_IN_FLIGHT:
        raise BadArgument(f"in_flight={width!r}: give a whole number of fills at once, 1 to {MAX_IN_FLIGHT} "
                          f"(default {width_for(source)} for {source.uri})")
    if name == "workers" and fetches_async(source) and width < BUCKET_IN_FLIGHT:
        warnings.warn(f"stage(workers={width}) caps {source.uri} at {width} downloads in flight; a bucket's "
                      f"default is {BUCKET_IN_FLIGHT}, as coroutines on one thread, not threads. Leave it out for the "
                      f"default, or pass in_flight={width} if a cap is what you want", UserWarning, stacklevel=3)
    return width


def shard_of(name: str, world_size: int) -> int:
    """Which of ``world_size`` ranks stages ``name``: stable across processes and runs."""
    return zlib.crc32(name.encode("utf-8", "surrogateescape")) % world_size


@dataclass
class StageReport:
    """What :func:`stage` did. ``MBps`` is bytes downloaded / wall seconds (10^6 B/s)."""

    files: int = 0
    fetched: int = 0
    already_cached: int = 0
    bytes_fetched: int = 0
    bytes_total: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    kept: int = 0  # of the objects staged (downloaded or already cached), how many are in the cache at the end
    evicted: int = 0  # how many of them were evicted to make room for later ones before the stage ended

    @property
    def MBps(self) -> float:
        return self.bytes_fetched / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        share = f" (rank {self.rank} of {self.world_size})" if self.world_size > 1 else ""
        text = (f"staged {self.files} files{share}: {self.fetched} downloaded ({self.bytes_fetched / 1e6:.1f} MB), "
                f"{self.already_cached} already cached, in {self.seconds:.1f} s = {self.MBps:.1f} MB/s, "
                f"{len(self.failures)} failures")
        if self.evicted:
            text += (f"\n  only {self.kept} of {self.kept + self.evicted} are in the cache: {self.evicted} were evicted "
                     "to make room for later ones (the budget or the disk is too small for all of them)")
        for name, err in self.failures[:5]:
            text += f"\n  failed: {name}: {err}"
        if len(self.failures) > 5:
            text += f"\n  ... and {len(self.failures) - 5} more"
        return text


def stage(
    source: Source,
    cache: Cache,
    names: Iterable[str | Entry] | None = None,
    workers: int | None = None,
    progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
    *,
    in_flight: int | None = None,
) -> StageReport:
    """Fill ``cache`` with every object of ``source`` (or ``names``), ``in_flight`` at a time
    (default :func:`width_for`: 256 downloads in flight from a bucket, 32 threads on a folder).

    A bucket's objects are downloaded as coroutines on one thread (large ones in parallel byte
    ranges), a folder's by ``in_flight`` threads. The listing streams, so downloads start with the
    first page. Objects already cached are skipped. Failures do not stop the others; they are listed in the report. With
    ``world_size`` > 1, this call stages only the objects whose :func:`shard_of` is ``rank``.
    ``workers`` is the older name of ``in_flight``: below the default on a bucket it warns, since a
    thread count there (``workers=32``) caps the downloads in flight, which was never the point.
    """
    if not 0 <= rank < world_size:
        raise BadArgument(f"rank must be in [0, {world_size}), got {rank}")
    width = _width(source, workers, in_flight)
    items = _listed(source) if names is None else names
    if world_size > 1:
        items = (item for item in items
                 if shard_of(item.name if isinstance(item, Entry) else item, world_size) == rank)
    report = StageReport(rank=rank, world_size=world_size)
    staged = bytearray()  # the 32-byte keys of what this stage filled or found cached
    evictions = cache.stats().evictions
    t0 = time.perf_counter()
    with progress_bar(progress, desc=f"staging {source.uri}", unit="file", dynamic_ncols=True) as bar:
        for filled in cache.fill_many(source, items, width=width):
            if filled.error is not None:
                report.failures.append((filled.name, f"{filled.error.__class__.__name__}: {filled.error}"))
            else:
                report.bytes_total += filled.size
                if filled.fetched >= 0 and filled.entry is not None:
                    staged += bytes.fromhex(cache.key(source, filled.entry))
                if filled.fetched > 0:
                    report.fetched += 1
                    report.bytes_fetched += filled.fetched
                elif filled.fetched == 0:
                    report.already_cached += 1
                else:
                    report.failures.append((filled.name, f"does not fit in the cache: {filled.refusal}"))
            report.files += 1
            bar.update(1)
            elapsed = time.perf_counter() - t0
            rate = report.bytes_fetched / elapsed / 1e6
            bar.set_postfix_str(f"{report.bytes_fetched / 1e6:.0f} MB, {rate:.1f} MB/s", refresh=False)
    report.seconds = time.perf_counter() - t0
    keys = [staged[i:i + 32].hex() for i in range(0, len(staged), 32)]
    # Only this process evicts for this stage's fills; with no eviction here, everything staged is still there.
    report.kept = len(keys) if cache.stats().evictions == evictions else sum(map(cache.contains_key, keys))
    report.evicted = len(keys) - report.kept
    if progress:
        print(report)
    return report


def _listed(source: Source) -> Iterator[Entry]:
    """``source.list()``, and :class:`NotFoundAtSource` if it lists nothing: a wrong path or prefix."""
    empty = True
    for entry in source.list():
        empty = False
        yield entry
    if empty:
        raise NotFoundAtSource(f"nothing to stage: {source.uri} lists no objects; check the path or prefix")


class Prefetcher:
    """Fills the entries of ``order`` ahead of a reader in the background: at most ``width``
    fills at once (default :func:`width_for` the source), never more than ``ahead`` positions
    past the reader (default four times ``width``), and under a cache budget never more bytes
    ahead than half of ``max_bytes``, so that nothing filled is evicted before it is read.

    Call :meth:`advance` with the reader's position (or let :class:`~dataferry.CachedDataset`'s
    prefetching sampler do it). Fills are queued in small batches (``width // 8``, at least 1, at most ``ahead``),
    a whole one once the window has room for it, and a batch that finishes queues more at once, so one slow object
    holds one slot, not the reader's whole window: reads of prefetched items are cache hits, and a read of an item
    still downloading waits for that one download instead of starting a second. An entry for which
    ``needs_source(entry)`` is False is passed over, and takes no room ahead (its reader needs nothing from the
    source: decode-once's record of it is cached).
    """

    def __init__(self, source: Source, cache: Cache, order: Sequence[Entry], ahead: int | None = None,
                 width: int | None = None, needs_source: Callable[[Entry], bool] | None = None) -> None:
        self.source, self.cache, self.order, self.needs_source = source, cache, order, needs_source
        self.width = width or min(width_for(source), ahead or width_for(source))
        self.ahead = ahead or 4 * self.width
        self._batch = min(max(self.width // 8, 1), self.ahead)
        self._closed = False
        self._next = self._position = self._in_flight = 0
        self._due = 0  # the reader's position from which the window may have room for a batch
        self._most = cache.max_bytes // 2 if cache.max_bytes is not None else None
        self._window = 0  # under a budget: bytes of order[_position:_next] filled or filling, not yet passed
        self._sizes: deque[int] = deque()  # ... and what each of those positions counts in it (0: passed over)
        self._lock = threading.RLock()  # a batch already done runs its callback inside add_done_callback
        self._topping = False
        self._futures: deque[Future] = deque()  # the fills in flight, not the epoch's
        self.errors: list[tuple[str, str]] = []

    def advance(self, position: int) -> None:
        """The reader is at ``position`` in ``order``: queue what the window now allows. Called at every position,
        it returns at once while the window has no room for a whole batch; under a full budget, or with ``width``
        fills in flight, it looks each time. (A warm epoch's reader then pays for each sample once, in its batch:
        the entry, its key's hash and one ``stat``, about 12 us here.)"""
        if position < self._due:
            return
        with self._lock:
            if self._most is not None:
                for _ in range(self._position, min(position, self._next)):
                    self._window -= self._sizes.popleft()
            self._position = max(self._position, position)
            self._top_up()

    def _top_up(self) -> None:
        """Queue batches (under the lock) while fewer than ``width`` fills are in flight: whole ones while the window
        has room, shorter where ``width``, the budget or the order's end stops them (one fill ahead per sample read
        cost a warm epoch's reader more than its read). A batch that is done at once calls back in here: it only
        frees its slots, and this loop goes on."""
        if self._topping:
            return
        self._topping = True
        try:
            if self._next <= self._position:  # what the reader has passed, it read itself (advance took its bytes off)
                self._next = self._position
            stop = min(len(self.order), self._position + self.ahead)
            full = False  # stopped by the budget: any move of the reader may free room
            while not self._closed and self._next < stop and self._in_flight < self.width:
                if stop - self._next < self._batch and stop < len(self.order):
                    break
                end = min(stop, self._next + self._batch, self._next + self.width - self._in_flight)
                batch = []
                for i in range(self._next, end):
                    entry = self.order[i]
                    needed = self.needs_source is None or self.needs_source(entry)
                    if self._most is not None:
                        size = entry.size if needed else 0
                        if size and self._window and self._window + size > self._most:
                            full = True
                            break  # a window of one is allowed, however large
                        self._window += size
                        self._sizes.append(size)
                    self._next = i + 1
                    if needed:
                        batch.append(entry)
                if batch:
                    futures = self.cache.fill_later(self.source, batch, threads=self.width)
                    share = len(batch) // len(futures)
                    self._in_flight += share * len(futures)
                    for fut in futures:
                        self._futures.append(fut)
                        fut.add_done_callback(functools.partial(self._finished, share=share))
                if full:
                    break
            if self._next >= len(self.order):
                self._due = len(self.order)  # nothing left to queue
            else:
                self._due = self._position + 1 if full else self._next + self._batch - self.ahead
            self._prune()
        finally:
            self._topping = False

    def _finished(self, fut: Future, share: int) -> None:
        """A batch ended (on the thread that ran it): note what failed (the reader's own read
        raises it properly) and queue more."""
        with self._lock:
            self._in_flight -= share
            if not fut.cancelled():
                if fut.exception() is not None:
                    e = fut.exception()
                    self.errors.append(("(a batch)", f"{e.__class__.__name__}: {e}"))
                else:
                    self.errors.extend((name, f"{e.__class__.__name__}: {e}") for name, e in fut.result())
            self._top_up()

    def wait(self) -> None:
        """Block until nothing is in flight: every fill the reader's position allows is done."""
        while True:
            with self._lock:
                self._prune()
                futures = [fut for fut in self._futures if not fut.done()]
            if not futures:
                return
            wait(futures)

    def _prune(self) -> None:
        """Forget finished fills (under the lock): only those in flight are kept."""
        while self._futures and self._futures[0].done():
            self._futures.popleft()

    def close(self) -> None:
        """Stop: queue nothing more, and wait for the fills in flight."""
        with self._lock:
            self._closed = True
        self.wait()

    def __enter__(self) -> Prefetcher:
        self.advance(0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Prefetcher {self._next}/{len(self.order)} queued, {self._in_flight} in flight, "
                f"width={self.width}, ahead={self.ahead}, errors={len(self.errors)}>")
