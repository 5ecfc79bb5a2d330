"""The cache's face: :class:`Cache` joins filling, budget and recovery over one folder, and owns
what is per process (connections, locks, counters, the index writer), renewed after a fork."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import io
import math
import os
import shutil
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c

from dataferry.cache.budget import DEFAULT_MIN_FREE_BYTES, Budget
from dataferry.cache.checksum import b64
from dataferry.cache.bulk import BulkFilling
from dataferry.cache.errors import CacheFolderError, DamagedOnDisk
from dataferry.cache.fill import Filling
from dataferry.cache.index import FLUSH_EVERY, FLUSH_S, IndexWriter, connect, create, damaged
from dataferry.cache.layout import CHUNK, lay_out, printable
from dataferry.cache.layout import key as entry_key
from dataferry.cache.locks import FillLocks, renew_after_fork
from dataferry.cache.placing import Placing
from dataferry.cache.recovery import Recovery
from dataferry.errors import BadArgument, byte_count, interrupted_at_exit
from dataferry.sources import DEFAULT_RETRY_DEADLINE_S, ChangedAtSource, Entry, Source, where

__all__ = ["Cache", "CacheStats"]


@dataclass
class CacheStats:
    """Counters of one process's use of a cache (each DataLoader worker keeps its own)."""

    hits: int = 0
    misses: int = 0
    bytes_from_source: int = 0
    bytes_from_cache: int = 0
    evictions: int = 0
    refetches: int = 0
    retries: int = 0
    streamed: int = 0
    wait_s: float = 0.0
    fetch_s: float = 0.0

    def __repr__(self) -> str:
        return (f"CacheStats(hits={self.hits}, misses={self.misses}, from_source={self.bytes_from_source / 1e6:.1f} MB, "
                f"from_cache={self.bytes_from_cache / 1e6:.1f} MB, evictions={self.evictions}, "
                f"refetches={self.refetches}, retries={self.retries}, streamed={self.streamed}, "
                f"wait={self.wait_s:.2f} s, fetch={self.fetch_s:.2f} s)")


def _flush_at_exit(ref: weakref.ref) -> None:
    cache = ref()
    if cache is not None and cache._pid == os.getpid():
        try:
            cache._flush()
        except KeyboardInterrupt:
            interrupted_at_exit(f"writing the index of the cache {cache.root}: nothing is lost, the next open "
                                "completes it")
        except Exception:  # noqa: BLE001, S110 - never fail an exiting process
            pass


def _read_all(fd: int, size: int) -> bytes:
    """Read a whole file of expected ``size`` (one syscall when it is that size)."""
    data = os.read(fd, size + 1)
    if len(data) == size + 1 or len(data) == 0 or len(data) == size:
        return data
    parts = [data]
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    return b"".join(parts)


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


class Cache(Filling, BulkFilling, Budget, Recovery):
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
        lay_out(self.root)
        self._init_process_state()
        try:
            self._open_index()
        except sqlite3.DatabaseError as e:
            if not damaged(e):
                raise
            self._set_index_aside(e)
            self._open_index()

    def _open_index(self) -> None:
        create(self._db())
        self._recover()

    # -- per-process state (connections and locks never cross fork or pickle) -------------------

    @classmethod
    def existing(cls, root: str | os.PathLike[str], **options: Any) -> Cache:
        """An existing cache; :class:`CacheFolderError` rather than a new cache at a mistyped path."""
        try:
            is_cache = (Path(root) / "index.sqlite").is_file()
        except OSError as e:
            raise CacheFolderError.opening(Path(root).absolute(), e) from None
        if not is_cache:
            raise CacheFolderError(2, f"{Path(root).absolute()} is not a dataferry cache (it has no index.sqlite): "
                                      "check the path")
        return cls(root, **options)

    def _init_process_state(self) -> None:
        """Locks, connections, counters and the writer thread of this process. A forked child gets
        fresh ones at once (``os.register_at_fork``, as fsspec does): a lock some parent thread held
        at the fork would otherwise stay held in the child forever."""
        renew_after_fork(self)
        self._objects, self._locks, self._tmp = (str(self.root / sub) for sub in ("objects", "locks", "tmp"))
        self._fill_locks = FillLocks(self._locks)
        self._pid = os.getpid()
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._writer = threading.RLock()
        self._touched: dict[str, float] = {}
        self._last_flush = time.time()
        self._stats = CacheStats()
        self._index_writer: IndexWriter | None = None
        self._held: dict = {}  # fill locks held by this process's download loop, by key
        self._placing = Placing(self._tmp)  # its download loop's finished fills, put in place by groups
        self._fill_threads = None  # fill_later's threads, for sources without fetch_async
        self._fill_width = 0  # how many of them
        atexit.register(_flush_at_exit, weakref.ref(self))

    @property
    def _index(self) -> IndexWriter:
        if self._pid != os.getpid():
            self._init_process_state()
        if self._index_writer is None or not self._index_writer.alive:
            with self._mutex:
                if self._index_writer is None or not self._index_writer.alive:
                    self._index_writer = IndexWriter(self)
        return self._index_writer

    def __getstate__(self) -> dict:
        keep = ("root", "max_bytes", "min_free_bytes", "max_refetches", "retry_deadline_s")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def _db(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # forked: start afresh, the parent's connections are not ours
            self._init_process_state()
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    @contextlib.contextmanager
    def _write(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction (on this thread's connection unless one is given)."""
        db = db or self._db()
        with self._writer:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _count(self, **delta: float) -> None:
        with self._mutex:
            for k, v in delta.items():
                setattr(self._stats, k, getattr(self._stats, k) + v)

    def _connect(self) -> sqlite3.Connection:
        return connect(self.root)

    # -- keys and paths ---------------------------------------------------------------------

    @staticmethod
    def key(source: Source, entry: Entry) -> str:
        """The entry's key: a hash of (source, name, version); object names never become paths."""
        return entry_key(source, entry)

    def _object_path(self, key: str) -> str:
        return f"{self._objects}/{key[:2]}/{key}"

    @staticmethod
    def _entry(source: Source, item: Entry | str) -> Entry:
        return item if isinstance(item, Entry) else source.stat(item)

    def _fill_lock(self, key: str) -> contextlib.AbstractContextManager[bool]:
        return self._fill_locks.hold(key)

    # -- reading ----------------------------------------------------------------------------

    def read(self, source: Source, item: Entry | str) -> bytes:
        """The bytes of an object, from the cache, filling it first on a miss.

        Given a name, the source is asked for its current version first (one metadata request),
        so a changed object is never served stale, and an object overwritten between that request
        and the download is asked for again; given an :class:`Entry`, that version is read.
        A cached copy of the wrong size is dropped and fetched again.
        """
        return self._by_name(source, item, self._read)

    def _by_name(self, source: Source, item: Entry | str, action):
        """``action(source, entry)``; for a name, once more with a fresh stat if it changed meanwhile."""
        try:
            return action(source, self._entry(source, item))
        except ChangedAtSource:
            if isinstance(item, Entry):
                raise
            return action(source, source.stat(item))

    def _read(self, source: Source, entry: Entry) -> bytes:
        """The cached copy's bytes, filled first on a miss; a copy of the wrong size is dropped and filled again."""
        key = self.key(source, entry)
        path = self._object_path(key)
        hit = True
        for _ in range(self.max_refetches + 3):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                hit = False
                if self.fill(source, entry) < 0:
                    return self._stream(source, entry)  # checked as it streamed
                continue
            # No lock needed: eviction only unlinks, and an open descriptor still reads every byte.
            try:
                data = _read_all(fd, entry.size)
            finally:
                os.close(fd)
            if len(data) == entry.size:
                with self._mutex:
                    self._stats.hits += hit
                    self._stats.bytes_from_cache += len(data)
                self._touch(key)
                return data
            self._discard(key)
            self._count(refetches=1)
            hit = False
        raise DamagedOnDisk(f"{where(source, printable(entry.name))}: the cached copy kept coming back the wrong size "
                            f"({self.max_refetches + 3} times): the local disk under {self.root} is failing; use a "
                            "cache folder on another disk")

    def read_verified(self, source: Source, item: Entry | str) -> bytes:
        """:meth:`read`, with the bytes checked against the object's CRC32C (the source's, or the one
        computed when it was filled): a copy damaged on disk since is dropped and fetched again, never
        returned. Costs one pass of CRC32C (GB/s); meant for large objects such as shards."""
        return self._by_name(source, item, self._read_verified)

    def _read_verified(self, source: Source, entry: Entry) -> bytes:
        """Every read back is checked, even of a copy filled a moment ago: the fill checked the bytes it
        received, and a failing disk can still return others."""
        key = self.key(source, entry)
        for _ in range(self.max_refetches + 1):
            data = self._read(source, entry)
            filled = getattr(self._local, "filled", None)
            self._local.filled = None
            expected = entry.crc32c or (filled[1] if filled and filled[0] == key else None) or self._stored_crc(key)
            if expected is None or b64(google_crc32c.value(data)) == expected:
                return data
            self._discard(key)
            self._count(refetches=1)
        raise DamagedOnDisk(f"{where(source, printable(entry.name))}: the cached copy kept reading back other bytes "
                            f"than were written and checked ({self.max_refetches + 1} times): the local disk under "
                            f"{self.root} is failing; use a cache folder on another disk")

    def _stored_crc(self, key: str) -> str | None:
        """The CRC32C computed when ``key`` was filled: one query, and a wait for this process's pending
        index writes only when its row is not marked ready yet (it was filled a moment ago)."""
        for pending in (False, True):
            if pending:
                self._flush()
            row = self._db().execute("SELECT crc32c FROM entries WHERE key = ?", (key,)).fetchone()
            if row and row[0]:
                return row[0]
        return None

    def open(self, source: Source, item: Entry | str) -> BinaryIO:
        """A binary file object on the cached copy, kept from eviction until it is closed."""
        return self._by_name(source, item, self._open)

    def _open(self, source: Source, entry: Entry) -> BinaryIO:
        key = self.key(source, entry)
        path = self._object_path(key)
        hit = True
        while True:
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                hit = False
                if self.fill(source, entry) < 0:
                    return io.BytesIO(self._stream(source, entry))
                continue
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # eviction skips entries with a reader
            if os.fstat(f.fileno()).st_nlink == 0:  # evicted between open and lock: fill again
                f.close()
                continue
            self._count(hits=int(hit))
            self._touch(key)
            return f

    def path(self, source: Source, item: Entry | str) -> Path:
        """The cached file's path (filling it first). Not protected from eviction: prefer :meth:`open`."""
        return self._by_name(source, item, self._path)

    def _path(self, source: Source, entry: Entry) -> Path:
        if self.fill(source, entry) < 0:
            raise OSError(f"{where(source, printable(entry.name))} ({entry.size} bytes) does not fit in the cache")
        return Path(self._object_path(self.key(source, entry)))

    def contains(self, source: Source, item: Entry) -> bool:
        """Whether that version of the object is in the cache now."""
        return self.contains_key(self.key(source, item))

    def contains_key(self, key: str) -> bool:
        """Whether the entry of :meth:`key` ``key`` is in the cache now."""
        return os.path.exists(self._object_path(key))

    def _touch(self, key: str) -> None:
        """Note a use for LRU; sent to the index writer in batches, not on every hit."""
        now = time.time()
        self._touched[key] = now
        if len(self._touched) >= FLUSH_EVERY or now - self._last_flush > FLUSH_S:
            with self._mutex:
                touched, self._touched = self._touched, {}
                self._last_flush = now
            self._index.touch(touched)

    def _flush(self) -> None:
        """Wait until every pending index write of this process is applied."""
        with self._mutex:
            touched, self._touched = self._touched, {}
        if touched:
            self._index.touch(touched)
        if self._index_writer is not None or touched:
            self._index.flush()

    # -- reporting --------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        """This process's counters (a copy)."""
        with self._mutex:
            return CacheStats(**{f.name: getattr(self._stats, f.name) for f in fields(CacheStats)})

    def usage(self) -> tuple[int, int]:
        """(entries, bytes) in the cache, counting fills in progress."""
        return self._db().execute("SELECT entries, bytes FROM usage").fetchone()

    def entries(self) -> list[dict]:
        """Every index row, most recently used first (for inspection)."""
        self._flush()
        cur = self._db().execute(
            "SELECT source, name, version, size, crc32c, state, last_used FROM entries ORDER BY last_used DESC")
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def __repr__(self) -> str:
        n, used = self.usage()
        budget = f" of {self.max_bytes / 1e6:,.1f} MB" if self.max_bytes is not None else ""
        return f"<Cache {self.root}: {n} entries, {used / 1e6:,.1f} MB{budget}>"
