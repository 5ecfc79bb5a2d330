"""Moving many objects into a cache: parallel staging and prefetch ahead of a reader.

``stage`` copies a whole source (or a list of names) into a cache with many threads, so
per-request latency overlaps; with ``rank``/``world_size`` each of N processes stages its share.
``Prefetcher`` fills the next K items of a known order in the background while a reader works.
"""

from __future__ import annotations

import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

with warnings.catch_warnings():
    # Without ipywidgets, tqdm.auto falls back to a text bar and warns; the text bar is fine.
    warnings.filterwarnings("ignore", message="IProgress not found")
    from tqdm.auto import tqdm

from dataferry.cache import Cache
from dataferry.sources import Entry, Source, fetches_async

__all__ = ["stage", "StageReport", "Prefetcher", "DEFAULT_WORKERS", "BUCKET_IN_FLIGHT", "width_for", "shard_of"]

DEFAULT_WORKERS = 32  # threads reading a folder (a Drive or gcsfuse mount) at once
BUCKET_IN_FLIGHT = 256  # a bucket's downloads in flight at once: coroutines on one thread, not threads


def width_for(source: Source) -> int:
    """How many fills :func:`stage` runs at once by default for ``source``."""
    return BUCKET_IN_FLIGHT if fetches_async(source) else DEFAULT_WORKERS


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

    @property
    def MBps(self) -> float:
        return self.bytes_fetched / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        share = f" (rank {self.rank} of {self.world_size})" if self.world_size > 1 else ""
        text = (f"staged {self.files} files{share}: {self.fetched} downloaded ({self.bytes_fetched / 1e6:.1f} MB), "
                f"{self.already_cached} already cached, in {self.seconds:.1f} s = {self.MBps:.1f} MB/s, "
                f"{len(self.failures)} failures")
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
) -> StageReport:
    """Fill ``cache`` with every object of ``source`` (or ``names``), ``workers`` at a time
    (default :func:`width_for`: 256 downloads in flight from a bucket, 32 threads on a folder).

    A bucket's objects are downloaded as coroutines on one thread (large ones in parallel byte
    ranges), a folder's by ``workers`` threads. The listing streams, so downloads start with the
    first page. Objects already cached are skipped. Failures do not stop the others; they are listed in the report. With
    ``world_size`` > 1, this call stages only the objects whose :func:`shard_of` is ``rank``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    items = source.list() if names is None else names
    if world_size > 1:
        items = (item for item in items
                 if shard_of(item.name if isinstance(item, Entry) else item, world_size) == rank)
    report = StageReport(rank=rank, world_size=world_size)
    bar = tqdm(desc=f"staging {source.uri}", unit="file", disable=not progress, dynamic_ncols=True)
    t0 = time.perf_counter()
    for filled in cache.fill_many(source, items, width=workers or width_for(source)):
        if filled.error is not None:
            report.failures.append((filled.name, f"{filled.error.__class__.__name__}: {filled.error}"))
        else:
            report.bytes_total += filled.size
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
        bar.set_postfix_str(f"{report.bytes_fetched / 1e6:.0f} MB, {report.bytes_fetched / elapsed / 1e6:.1f} MB/s",
                            refresh=False)
    report.seconds = time.perf_counter() - t0
    bar.close()
    if progress:
        print(report)
    return report


class Prefetcher:
    """Keeps the next ``ahead`` entries of ``order`` (default :func:`width_for` the source) being
    filled into ``cache`` in the background.

    Call :meth:`advance` with the reader's position (or let :class:`~dataferry.CachedDataset`'s
    prefetching sampler do it); reads of prefetched items are cache hits, and a read of an item
    still downloading waits for that one download instead of starting a second.
    """

    def __init__(self, source: Source, cache: Cache, order: Sequence[Entry], ahead: int | None = None) -> None:
        self.source, self.cache, self.order, self.ahead = source, cache, order, ahead or width_for(source)
        self._closed = False
        self._next = 0
        self._lock = threading.Lock()
        self._futures: deque[Future] = deque()  # the fills in flight, not the epoch's
        self.errors: list[tuple[str, str]] = []

    def _failed(self, fut: Future) -> None:
        """Note what failed (the reader's own read raises it properly)."""
        if fut.cancelled():
            return
        if fut.exception() is not None:
            e = fut.exception()
            self.errors.append(("(a batch)", f"{e.__class__.__name__}: {e}"))
            return
        self.errors.extend((name, f"{e.__class__.__name__}: {e}") for name, e in fut.result())

    def advance(self, position: int) -> None:
        """The reader is at ``position`` in ``order``: once fewer than ``ahead / 2`` items ahead of
        it are queued, queue up to ``position + ahead`` (in one batch, not one by one)."""
        with self._lock:
            if self._closed or self._next >= min(len(self.order), position + max(self.ahead // 2, 1)):
                return
            stop = min(len(self.order), position + self.ahead)
            batch = [self.order[i] for i in range(self._next, stop)]
            self._next = stop
            for fut in self.cache.fill_later(self.source, batch):
                fut.add_done_callback(self._failed)
                self._futures.append(fut)
            self._prune()

    def wait(self) -> None:
        """Block until every queued fill has finished."""
        with self._lock:
            futures = list(self._futures)
        wait(futures)
        with self._lock:
            self._prune()

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
        return f"<Prefetcher {self._next}/{len(self.order)} queued, ahead={self.ahead}, errors={len(self.errors)}>"
