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
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

with warnings.catch_warnings():
    # Without ipywidgets, tqdm.auto falls back to a text bar and warns; the text bar is fine.
    warnings.filterwarnings("ignore", message="IProgress not found")
    from tqdm.auto import tqdm

from dataferry.cache import Cache
from dataferry.sources import Entry, Source

__all__ = ["stage", "StageReport", "Prefetcher", "DEFAULT_WORKERS", "shard_of"]

DEFAULT_WORKERS = 32


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
    workers: int = DEFAULT_WORKERS,
    progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
) -> StageReport:
    """Fill ``cache`` with every object of ``source`` (or ``names``) using ``workers`` threads.

    The listing streams, so downloads start with the first page. Objects already cached are
    skipped. Failures do not stop the others; they are listed in the report. With
    ``world_size`` > 1, this call stages only the objects whose :func:`shard_of` is ``rank``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    items = source.list() if names is None else names
    report = StageReport(rank=rank, world_size=world_size)
    bar = tqdm(desc=f"staging {source.uri}", unit="file", disable=not progress, dynamic_ncols=True)
    t0 = time.perf_counter()

    def one(item: str | Entry) -> tuple[str, int, int, str]:
        entry = item if isinstance(item, Entry) else source.stat(item)
        fetched = cache.fill(source, entry)
        return entry.name, entry.size, fetched, cache.last_refusal if fetched < 0 else ""

    def settle(done: Iterable[Future], names_of: dict[Future, str]) -> None:
        for fut in done:
            name = names_of.pop(fut)
            try:
                _, size, fetched, refusal = fut.result()
            except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the rest
                report.failures.append((name, f"{e.__class__.__name__}: {e}"))
            else:
                report.bytes_total += size
                if fetched > 0:
                    report.fetched += 1
                    report.bytes_fetched += fetched
                elif fetched == 0:
                    report.already_cached += 1
                else:
                    report.failures.append((name, f"does not fit in the cache: {refusal}"))
            report.files += 1
            bar.update(1)
        elapsed = time.perf_counter() - t0
        bar.set_postfix_str(f"{report.bytes_fetched / 1e6:.0f} MB, {report.bytes_fetched / elapsed / 1e6:.1f} MB/s",
                            refresh=False)

    pending: dict[Future, str] = {}
    with ThreadPoolExecutor(workers, thread_name_prefix="dataferry-stage") as pool:
        for item in items:
            name = item.name if isinstance(item, Entry) else item
            if world_size > 1 and shard_of(name, world_size) != rank:
                continue
            pending[pool.submit(one, item)] = name
            if len(pending) >= 2 * workers:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                settle(done, pending)
        bar.total = report.files + len(pending)
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            settle(done, pending)
    report.seconds = time.perf_counter() - t0
    bar.close()
    if progress:
        print(report)
    return report


class Prefetcher:
    """Keeps the next ``ahead`` entries of ``order`` being filled into ``cache`` in the background.

    Call :meth:`advance` with the reader's position (or let :class:`~dataferry.CachedDataset`'s
    prefetching sampler do it); reads of prefetched items are cache hits, and a read of an item
    still downloading waits for that one download instead of starting a second.
    """

    def __init__(self, source: Source, cache: Cache, order: Sequence[Entry], ahead: int = 64,
                 workers: int = 8) -> None:
        self.source, self.cache, self.order, self.ahead = source, cache, order, ahead
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dataferry-prefetch")
        self._next = 0
        self._lock = threading.Lock()
        self._futures: deque[Future] = deque()  # the fills in flight, not the epoch's
        self.errors: list[tuple[str, str]] = []

    def _fill(self, entry: Entry) -> None:
        try:
            self.cache.fill(self.source, entry)
        except Exception as e:  # noqa: BLE001 - the reader's own read raises it properly
            self.errors.append((entry.name, f"{e.__class__.__name__}: {e}"))

    def advance(self, position: int) -> None:
        """The reader is at ``position`` in ``order``: make sure items up to position+ahead are queued."""
        with self._lock:
            stop = min(len(self.order), position + self.ahead)
            while self._next < stop:
                self._futures.append(self._pool.submit(self._fill, self.order[self._next]))
                self._next += 1
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
        """Stop: drop queued fills that have not started, wait for those in flight."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:
        self.advance(0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Prefetcher {self._next}/{len(self.order)} queued, ahead={self.ahead}, errors={len(self.errors)}>"
