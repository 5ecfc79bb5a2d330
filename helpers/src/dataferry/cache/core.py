"""The cache's face: :class:`Cache` composes the parts of one folder (its layout, index, budget, fill
locks, fill engine and checked reads) and owns what is per process, renewed after a fork."""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO, Callable, TypeVar

from dataferry.cache.budget import DEFAULT_MIN_FREE_BYTES, Budget
from dataferry.cache.counters import CacheStats, Counters
from dataferry.cache.errors import CacheFolderError
from dataferry.cache.fill import FillEngine, Filled
from dataferry.cache.index import Index
from dataferry.cache.layout import Layout
from dataferry.cache.layout import key as entry_key
from dataferry.cache.locks import FillLocks, renew_after_fork
from dataferry.cache.many import FillsAhead, fill_many
from dataferry.cache.reads import Reads
from dataferry.cache.recovery import VerifyReport, clear, recover, verify
from dataferry.errors import BadArgument, byte_count
from dataferry.sources import DEFAULT_RETRY_DEADLINE_S, ChangedAtSource, Entry, Source

__all__ = ["Cache", "CacheStats"]

T = TypeVar("T")


def _refuse_more_than_the_disk(root: Path, min_free_bytes: int) -> None:
    """A ``min_free_bytes`` over the size of the disk ``root`` is on (measured at its nearest existing
    folder, before anything is made) leaves no room for any fill: refuse it."""
    for folder in (root, *root.parents):
        try:
            total = shutil.disk_usage(folder).total
            break
        except OSError:  # not there yet, or a bad path that lay_out explains
            continue
    else:
        return
    if min_free_bytes > total:
        raise BadArgument(f"min_free_bytes={min_free_bytes} is more than the whole disk of {root} ({total} bytes): "
                          "the cache could never keep a file; give less (the default keeps 1 GiB free)")


def _describe(cache: Callable[[], Cache | None]) -> str:
    """The cache's ``repr``, through a weak reference: its parts never keep it alive."""
    alive = cache()
    return repr(alive) if alive is not None else "(a cache since dropped)"


class Cache:
    """A local cache folder of verified objects, with an optional byte budget and LRU eviction.

    ``max_bytes`` caps the cache (None: no cap); ``min_free_bytes`` keeps that much free on its
    disk. Both count fills in progress. Transient source errors are retried with backoff for up
    to ``retry_deadline_s``; a checksum mismatch is refetched ``max_refetches`` times.

        cache = Cache("/content/cache", max_bytes=50e9)
        data = cache.read(source, "train/00001.jpg")     # downloads once, then local
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_bytes: int | float | None = None,
        min_free_bytes: int | float = DEFAULT_MIN_FREE_BYTES,
        *,
        max_refetches: int = 2,
        retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S,
    ) -> None:
        if isinstance(root, str) and not root.strip():
            raise BadArgument(f"Cache({root!r}): an empty path would make the current folder a cache (and mark it "
                              "safe to delete); give a folder, e.g. /content/cache")
        self.root = Path(root).absolute()
        self.max_bytes = None if max_bytes is None else byte_count("max_bytes", max_bytes, unset="None: no cap")
        self.min_free_bytes = byte_count("min_free_bytes", min_free_bytes, unset="0 keeps nothing free")
        if type(max_refetches) is not int or max_refetches < 0:
            raise BadArgument(f"max_refetches={max_refetches!r}: give a whole number >= 0")
        if not (isinstance(retry_deadline_s, (int, float)) and 0 < retry_deadline_s < math.inf):
            raise BadArgument(f"retry_deadline_s={retry_deadline_s!r}: give a number of seconds > 0")
        self.max_refetches = max_refetches
        self.retry_deadline_s = retry_deadline_s
        _refuse_more_than_the_disk(self.root, self.min_free_bytes)
        Layout(self.root).make()
        self._init_process_state()
        self._index.renewed(self._recover)

    def _recover(self) -> None:
        """Clean what crashed processes left (:func:`~dataferry.cache.recovery.recover`), on this index file."""
        self._swept = self._index.renewals
        recover(self._layout, self._index, self._locks)

    def _after_renewal(self) -> None:
        """Once the index file was found damaged and replaced (by any thread or process), clean the folder for
        the new one: the objects the old one named are orphans now, and go (they are fetched again when read)."""
        if self._index.renewals != self._swept:
            self._index.renewed(self._recover)

    @classmethod
    def existing(cls, root: str | os.PathLike[str], **options: Any) -> Cache:
        """An existing cache; :class:`CacheFolderError` rather than a new cache at a mistyped path."""
        try:
            is_cache = Layout(Path(root)).index.is_file()
        except OSError as e:
            raise CacheFolderError.opening(Path(root).absolute(), e) from None
        if not is_cache:
            raise CacheFolderError(2, f"{Path(root).absolute()} is not a dataferry cache (it has no index.sqlite): "
                                      "check the path")
        return cls(root, **options)

    # -- per-process parts (connections, locks and threads never cross fork or pickle) ------------

    def _init_process_state(self) -> None:
        """This process's parts. A forked child gets fresh ones at once (``os.register_at_fork``, as
        fsspec does): a lock some parent thread held at the fork would otherwise stay held in the child."""
        renew_after_fork(self)
        self._layout = Layout(self.root)
        self._counters = Counters()
        self._locks = FillLocks(self._layout.fill_lock)
        self._index = Index(self._layout, Budget(self._layout, self.max_bytes, self.min_free_bytes, self._counters))
        self._fills = FillEngine(self._index, self._counters, self._locks, max_refetches=self.max_refetches,
                                 retry_deadline_s=self.retry_deadline_s)
        self._ahead = FillsAhead(self._fills)
        self._reads = Reads(self._layout, self._index, self._fills, self._counters, self._locks,
                            functools.partial(_describe, weakref.ref(self)))  # no cycle
        self._swept = 0  # the index's renewals this process has cleaned up after

    def __getstate__(self) -> dict:
        keep = ("root", "max_bytes", "min_free_bytes", "max_refetches", "retry_deadline_s")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    # -- keys ---------------------------------------------------------------------------------

    @staticmethod
    def key(source: Source, entry: Entry) -> str:
        """The entry's key: a hash of (source, name, version); object names never become paths."""
        return entry_key(source, entry)

    @staticmethod
    def _entry(source: Source, item: Entry | str) -> Entry:
        return item if isinstance(item, Entry) else source.stat(item)

    # -- filling ------------------------------------------------------------------------------

    def fill(self, source: Source, item: Entry | str) -> Filled:
        """Make sure the object is cached; how it ended: ``fetched`` bytes downloaded (0 if it was already
        there, -1 if it cannot fit in the budget, ``refusal`` saying why). One download per object per
        machine: other threads and processes asking for it at the same time wait for this one."""
        self._after_renewal()
        return self._fills.fill_now(source, self._entry(source, item))

    def fill_many(self, source: Source, items: Iterable[Entry | str], width: int = 64) -> Iterator[Filled]:
        """Fill every item, ``width`` at a time, yielding a :class:`Filled` as each ends (in any
        order; an item that failed carries its ``error``). ``items`` may be a stream (a listing): it
        is read as room frees up."""
        self._after_renewal()
        return fill_many(self._fills, source, items, width)

    def fill_later(self, source: Source, items: Sequence[Entry], threads: int = 32) -> list[Future]:
        """Start filling ``items`` in the background. Returns futures that end when they are done,
        each with a list of (name, error) for the fills that failed. For a source without
        ``fetch_async`` (a folder) they run on up to ``threads`` threads of this process."""
        self._after_renewal()
        return self._ahead.start(source, items, threads)

    # -- reading ------------------------------------------------------------------------------

    def read(self, source: Source, item: Entry | str) -> bytes:
        """The bytes of an object, from the cache, filling it first on a miss, checked against its CRC32C (the
        source's, or the one computed when it was filled): a copy damaged on disk since, even of the right
        size, is dropped and fetched again, never returned. One pass of CRC32C (GB/s; about 13 us for 64 KiB).

        Given a name, the source is asked for its current version first (one metadata request),
        so a changed object is never served stale, and an object overwritten between that request
        and the download is asked for again; given an :class:`Entry`, that version is read.
        """
        return self._by_name(source, item, self._reads.verified)

    def read_verified(self, source: Source, item: Entry | str) -> bytes:
        """:meth:`read` (which checks every read), by the name it had when :meth:`read` did not."""
        return self._by_name(source, item, self._reads.verified)

    def reread(self, key: str, size: int, crc32c: int, used_up: bool = False) -> bytes | None:
        """The first ``size`` bytes of a copy read checked before, read again with no query of the index and checked
        against ``crc32c`` (an int, as ``google_crc32c.value`` gives it), what that read learned of them; counted as
        a hit, and ``used_up`` demotes the copy (see :meth:`demote`). None when it is gone or they read back
        otherwise: then read it as before, which fills it again, checks it against what the index says now, or
        names a failing disk. :class:`~dataferry.CachedDataset` reads a sample again through it."""
        self._after_renewal()
        return self._reads.again(key, size, crc32c, used_up)

    def _by_name(self, source: Source, item: Entry | str, action: Callable[[Source, Entry], T]) -> T:
        """``action(source, entry)``; for a name, once more with a fresh stat if it changed meanwhile."""
        self._after_renewal()
        try:
            return action(source, self._entry(source, item))
        except ChangedAtSource:
            if isinstance(item, Entry):
                raise
            return action(source, source.stat(item))

    def open(self, source: Source, item: Entry | str) -> BinaryIO:
        """A binary file object on the cached copy, checked against the object's CRC32C as it is opened (as
        :meth:`read`), and kept from eviction until it is closed."""
        return self._by_name(source, item, self._reads.open)

    def path(self, source: Source, item: Entry | str) -> Path:
        """The cached file's path (filling it first), its bytes checked against the object's CRC32C as it is
        given (as :meth:`read`). Not protected from eviction, or from changes, afterwards: prefer :meth:`open`."""
        return self._by_name(source, item, self._reads.path)

    def contains(self, source: Source, item: Entry) -> bool:
        """Whether that version of the object is in the cache now."""
        return self.contains_key(self.key(source, item))

    def contains_key(self, key: str) -> bool:
        """Whether the entry of :meth:`key` ``key`` is in the cache now."""
        return os.path.exists(self._layout.object_path(key))

    # -- the budget ----------------------------------------------------------------------------

    def demote(self, source: Source, items: Iterable[Entry]) -> None:
        """Mark entries used up for now (a shard read this epoch): when room is needed they go before
        every other entry, the most recently demoted first, so what was kept from an earlier pass
        and is not yet read again stays. A later read of an entry undoes its demotion."""
        now = time.time()
        self._index.rank_now({self.key(source, e): -now for e in items})

    def will_read(self, source: Source, items: Sequence[Entry]) -> None:
        """Entries about to be read in this order (a pass over shards): when room is needed they go after
        every entry demoted as used up and before every other, the one read last first, so a pass over
        more than fits keeps what it reads soonest. Reading an entry undoes this, as it undoes a demotion."""
        self._index.rank_now({self.key(source, e): -(i + 1.0) for i, e in enumerate(items)})  # above -time, below uses

    def prune(self, max_bytes: int | None = None) -> int:
        """Evict least-recently-used entries (not those being read) until the cache holds at most
        ``max_bytes`` (default: its budget). Returns how many were evicted."""
        self._after_renewal()
        limit = self.max_bytes if max_bytes is None else byte_count("max_bytes", max_bytes)
        if limit is None:
            self._index.flush()
            return 0
        return self._index.prune(limit)

    # -- checking and reporting ----------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Re-read every cached object and check size and CRC32C; remove bad entries (they are
        fetched again on the next read) and files the index does not know. Safe while other
        processes fill, read and evict. Returns the report."""
        self._after_renewal()
        return self._index.renewed(lambda: verify(self._layout, self._index, self._locks))

    def clear(self) -> None:
        """Remove every ready entry. Fills in progress keep theirs; files being read stay readable
        until closed."""
        self._after_renewal()
        self._index.renewed(lambda: clear(self._layout, self._index))

    def stats(self) -> CacheStats:
        """This process's counters (a copy)."""
        return self._counters.copy()

    def usage(self) -> tuple[int, int]:
        """(entries, bytes) in the cache, counting fills in progress (those that reserved their own room,
        and this process's), not room a process leased for fills to come."""
        self._after_renewal()
        return self._index.usage()

    def entries(self) -> list[dict]:
        """Every entry of the index (fills in progress included, leases of room not), most recently used
        first (for inspection)."""
        self._after_renewal()
        return self._index.rows()

    def __repr__(self) -> str:
        n, used = self.usage()
        budget = f" of {self.max_bytes / 1e6:,.1f} MB" if self.max_bytes is not None else ""
        return f"<Cache {self.root}: {n} entries, {used / 1e6:,.1f} MB{budget}>"
