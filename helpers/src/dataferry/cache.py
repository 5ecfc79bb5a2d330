"""A verified, crash-safe local cache of objects from a :class:`~dataferry.sources.Source`.

Each object is stored once per machine under a name derived from (source, object name, version),
never from the object name itself, so hostile names cannot reach outside the cache folder and a
changed object is a different entry (never served stale). A fill downloads to a temp file in the
cache folder while computing CRC32C, checks size and checksum, fsyncs, and renames into place:
a file under ``objects/`` is always complete and verified, at any instant of a crash.

Layout of the cache folder::

    index.sqlite     entries: key, source, name, version, size, crc32c, state, pid, last_used (WAL)
    objects/ab/KEY   complete objects
    tmp/KEY.PID.part fills in progress (removed at the next open if PID is dead)
    locks/abc.lock   fill locks, striped by key: one download per object per machine

Many threads, DataLoader workers and processes may share one cache folder. Readers hold a
shared ``flock`` on the object while they read; eviction takes it exclusively without waiting,
so an entry that is being read is never evicted. Locks are released by the kernel when a
process dies, so a crashed filler cannot wedge the others.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import errno
import fcntl
import functools
import hashlib
import inspect
import io
import os
import shutil
import sqlite3
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
from google.api_core.exceptions import RetryError

from dataferry.sources import (DEFAULT_RETRY_DEADLINE_S, Attempts, ChangedAtSource, Entry, Source, SourceError,
                               is_transient, retry_policy, where)

__all__ = ["Cache", "CacheStats", "VerifyReport", "ChecksumError", "CacheFullWarning", "CacheFolderError",
           "DEFAULT_MIN_FREE_BYTES"]

DEFAULT_MIN_FREE_BYTES = 1 << 30  # leave 1 GiB free on the cache's disk
SCHEMA_VERSION = 1
CHUNK = 1 << 20
LOCK_STRIPES_HEX = 3  # 4096 fill-lock files
FLUSH_EVERY = 256
FLUSH_S = 2.0
IDLE_CHECK_S = 5.0
ROOM_WAIT_S = 10.0  # how long a fill waits for room held by readers or fills in flight
STALL_S = 30.0  # the longest wait for the next byte of a download before it is retried
MIN_FILL_BYTES_PER_S = 1e6  # a fill may take retry_deadline_s, or a second per MB if that is longer


class ChecksumError(SourceError):
    """An object's bytes did not match its checksum, every time it was downloaded."""


class CacheFolderError(OSError):
    """The cache folder cannot be used (missing, read-only, not a cache, its disk failing): the
    message names the folder and what to do. Never retried as if the network had failed."""


class CacheFullWarning(UserWarning):
    """An object could not fit in the cache's budget and was read straight from the source."""


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


@dataclass
class VerifyReport:
    """What :meth:`Cache.verify` checked and removed."""

    checked: int = 0
    bad: list[tuple[str, str, str]] = field(default_factory=list)  # (source, name, why)
    orphans_removed: int = 0

    @property
    def ok(self) -> bool:
        return not self.bad

    def __repr__(self) -> str:
        return f"VerifyReport(checked={self.checked}, bad={len(self.bad)}, orphans_removed={self.orphans_removed})"


class FillTimeout(TimeoutError):
    """A fill ran past its deadline while bytes still trickled in (never retried)."""


class _Hashing:
    """Writes through to ``out`` while computing CRC32C and counting bytes; past ``deadline``
    (a ``time.monotonic()`` value) it refuses more, so a trickling link cannot outlast the deadline."""

    def __init__(self, out: BinaryIO, deadline: float = float("inf")) -> None:
        self.out, self.n, self.crc, self.deadline = out, 0, google_crc32c.Checksum(), deadline

    def write(self, data: bytes) -> int:
        if time.monotonic() > self.deadline:
            raise FillTimeout(f"the deadline passed with {self.n} bytes received")
        try:
            self.out.write(data)
        except OSError as e:
            raise CacheFolderError(e.errno, f"writing to the cache's disk failed ({e.strerror}): check the "
                                            "disk, or use a cache folder on another one") from e
        self.crc.update(data)
        self.n += len(data)
        return len(data)

    def restart(self) -> None:
        self.out.seek(0)
        self.out.truncate()
        self.n, self.crc = 0, google_crc32c.Checksum()


def _utf8(name: str) -> bytes:
    """A name's bytes: names read from a folder may hold bytes that are not UTF-8 (surrogate-escaped)."""
    return name.encode("utf-8", "surrogateescape")


def _printable(name: str) -> str:
    """A name as the index stores and messages show it (undecodable bytes as \\xNN)."""
    return _utf8(name).decode("utf-8", "backslashreplace")


def _b64(checksum: google_crc32c.Checksum) -> str:
    return base64.b64encode(checksum.digest()).decode()


def _file_crc(path: Path) -> tuple[int, str]:
    """(size, base64 CRC32C) of a file, read in chunks."""
    c, n = google_crc32c.Checksum(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            c.update(chunk)
            n += len(chunk)
    return n, _b64(c)


def _flush_at_exit(ref: weakref.ref) -> None:
    cache = ref()
    if cache is not None and cache._pid == os.getpid():
        with contextlib.suppress(Exception):
            cache._flush()


def _read_all(fd: int, size: int) -> bytes:
    """Read a whole file of expected ``size`` (one syscall when it is that size)."""
    data = os.read(fd, size + 1)
    if len(data) == size + 1 or len(data) == 0 or len(data) == size:
        return data
    parts = [data]
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    return b"".join(parts)


def _release(doomed: list[tuple[str, int]], unlink: bool) -> None:
    """Unlink evicted files (after their rows' deletion committed) and drop the locks that kept
    readers out meanwhile; ``unlink=False`` (the transaction failed) keeps every file."""
    for path, fd in doomed:
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if fd >= 0:
            os.close(fd)
    doomed.clear()


@functools.lru_cache(maxsize=64)
def _fetch_takes_timeout(cls: type) -> bool:
    return "timeout" in inspect.signature(cls.fetch).parameters


def _takes_timeout(source: Source) -> bool:
    return _fetch_takes_timeout(type(source))


def _disk_full(exc: BaseException) -> bool:
    """The cache's disk (or its index) ran out of space."""
    if isinstance(exc, sqlite3.OperationalError):
        return "full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def _source_blip(exc: BaseException) -> bool:
    """Worth retrying: a transient error of the source, never one of the cache's own disk, nor a deadline."""
    return not isinstance(exc, (CacheFolderError, FillTimeout)) and is_transient(exc)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except OSError:
        return False


@dataclass(frozen=True)
class Refusal:
    """Why a fill found no room; ``transient`` when readers or fills in flight hold the room."""

    why: str
    transient: bool = False


class _IndexWriter:
    """One thread per process applies index writes in batches ("group commit").

    Under a pool of staging threads, a write per fill serialises every fill behind the GIL: each
    sqlite call releases it, and taking it back can wait a whole switch interval. Here a batch
    of any size costs a handful of sqlite calls. Reservations wait for their answer; finished
    fills and LRU times are fire-and-forget (a crash before they are written leaves rows that
    ``Cache._recover`` completes at the next open).
    """

    def __init__(self, cache: Cache) -> None:
        self._cache_ref = weakref.ref(cache)  # the thread must not keep its cache alive
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._later: list = []  # finished fills and cancellations a full disk refused: tried with the next batch
        self._thread = threading.Thread(target=self._run, name="dataferry-index", daemon=True)
        self._thread.start()

    def reserve(self, row: tuple) -> bool:
        fut: Future = Future()
        self._queue.put(("reserve", row, fut))
        return self._wait(fut)

    def ready(self, crc: str, when: float, key: str) -> None:
        self._queue.put(("ready", (crc, when, key), None))

    def touch(self, touched: dict[str, float]) -> None:
        self._queue.put(("touch", touched, None))

    def forget(self, key: str) -> None:
        self._queue.put(("forget", key, None))

    def flush(self) -> None:
        fut: Future = Future()
        self._queue.put(("flush", None, fut))
        self._wait(fut)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _wait(self, fut: Future) -> Any:
        """The answer to a request; an error, not a wait forever, if the writer thread has died."""
        while True:
            try:
                return fut.result(timeout=1.0)
            except FutureTimeout:
                if not self._thread.is_alive():
                    raise RuntimeError("the cache's index writer thread stopped before answering; "
                                       "try again (a new one starts)") from None

    def _run(self) -> None:
        cache = self._cache_ref()
        db = cache._connect() if cache is not None else None
        del cache
        while db is not None:
            try:
                batch = [self._queue.get(timeout=IDLE_CHECK_S)]
            except queue.Empty:
                if self._cache_ref() is None:  # the cache is gone: so is this thread
                    db.close()
                    return
                continue
            while len(batch) < 4096:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch, self._later = self._later + batch, []
            if any(kind == "stop" for kind, _, _ in batch):
                batch = [item for item in batch if item[0] != "stop"]
                db = None
            cache = self._cache_ref()
            try:
                self._commit(cache, db or cache._connect(), batch)
            finally:
                del cache

    def _commit(self, cache: Cache | None, db: sqlite3.Connection, batch: list) -> None:
        """Apply a batch in one transaction; if it fails, item by item, so that one bad request
        fails alone and every other finished fill is still marked ready."""
        try:
            if cache is None:
                raise RuntimeError("the cache was closed")
            self._answer(self._transaction(cache, db, batch))
            return
        except BaseException as e:  # noqa: BLE001 - retried one by one below
            if len(batch) == 1 or cache is None:
                if batch[0][0] in ("ready", "forget") and _disk_full(e):
                    self._later += batch  # the disk may have room again by the next batch
                for _, _, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_exception(e)
                return
        for item in batch:
            self._commit(cache, db, [item])

    def _transaction(self, cache: Cache, db: sqlite3.Connection, batch: list) -> list[tuple[Future, Any]]:
        doomed: list[tuple[str, int]] = []
        try:
            with cache._write(db):
                answers = self._apply(cache, db, batch, doomed)
        except BaseException:
            _release(doomed, unlink=False)
            raise
        _release(doomed, unlink=True)  # files go only once the rows naming them are gone for good
        return answers

    @staticmethod
    def _answer(answers: list[tuple[Future, Any]]) -> None:
        for fut, answer in answers:
            if not fut.done():
                fut.set_result(answer)

    @staticmethod
    def _apply(cache: Cache, db: sqlite3.Connection, batch: list, doomed: list) -> list[tuple[Future, Any]]:
        ready = [args for kind, args, _ in batch if kind == "ready"]
        touched: dict[str, float] = {}
        for kind, args, _ in batch:
            if kind == "touch":
                touched.update(args)
        # Finished fills and recent uses first, so the LRU order below is current.
        db.executemany("UPDATE entries SET state = 'ready', crc32c = ?, last_used = ? WHERE key = ?", ready)
        db.executemany("UPDATE entries SET last_used = ? WHERE key = ?", [(t, k) for k, t in touched.items()])
        db.executemany("DELETE FROM entries WHERE key = ? AND state = 'filling'",
                       [(key,) for kind, key, _ in batch if kind == "forget"])
        answers: list[tuple[Future, Any]] = [(fut, None) for kind, _, fut in batch if kind == "flush"]
        wants = [(args, fut) for kind, args, fut in batch if kind == "reserve"]
        if not wants:
            return answers
        used, filling = db.execute("SELECT bytes, filling_bytes FROM usage").fetchone()
        free = shutil.disk_usage(cache.root).free - filling
        victims = None
        reclaimed = False
        held = 0  # entries that could not be evicted because a reader holds them
        accepted = []
        for row, fut in wants:
            size = row[4]

            def over_budget() -> int:
                return used + size - cache.max_bytes if cache.max_bytes is not None else 0

            def short() -> int:
                return max(over_budget(), cache.min_free_bytes - (free - size), 0)

            if short() and not reclaimed:  # room held by fillers that died is room
                reclaimed = True
                if cache._reclaim_dead_fills(db, doomed):
                    used, filling = db.execute("SELECT bytes, filling_bytes FROM usage").fetchone()
                    free = shutil.disk_usage(cache.root).free - filling
            if short():
                victims = victims or cache._lru(db)
                for victim, vsize in victims:
                    if cache._evict(db, victim, doomed):
                        used, free = used - vsize, free + vsize
                        if not short():
                            break
                    else:
                        held += 1
            if short():
                if over_budget() > 0:
                    why = f"max_bytes={cache.max_bytes} would be exceeded ({used} B cached or being filled)"
                else:
                    why = (f"min_free_bytes={cache.min_free_bytes} would be crossed on the cache's disk "
                           f"({max(free, 0)} B free there, after {filling} B of fills in flight)")
                answers.append((fut, Refusal(why, transient=bool(held or filling))))
                continue
            used, free = used + size, free - size
            accepted.append(row)
            answers.append((fut, None))
        db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, NULL, 'filling', ?, ?, ?)", accepted)
        return answers


_LIVE: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_LIVE):
        cache._init_process_state()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        self.root = Path(root).absolute()
        self.max_bytes = int(max_bytes) if max_bytes is not None else None
        self.min_free_bytes = int(min_free_bytes)
        self.max_refetches = max_refetches
        self.retry_deadline_s = retry_deadline_s
        try:
            if not (self.root / "objects" / "ff").is_dir():  # lay out the folder once
                for sub in ("tmp", "locks", *(f"objects/{i:02x}" for i in range(256))):
                    (self.root / sub).mkdir(parents=True, exist_ok=True)
            tag = self.root / "CACHEDIR.TAG"
            if not tag.exists():
                tag.write_text("Signature: 8a477f597d28d172789f06886806bc55\n# dataferry cache: safe to delete\n")
            if not os.access(self.root, os.W_OK):
                raise PermissionError(13, "read-only")
        except OSError as e:
            raise CacheFolderError(e.errno, f"cannot write to the cache folder {self.root} ({e.strerror}): "
                                            "choose a writable folder, e.g. /content/cache in Colab") from None
        self._init_process_state()
        with self._db() as db:
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
                CREATE TABLE IF NOT EXISTS entries (
                    key TEXT PRIMARY KEY, source TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL,
                    size INTEGER NOT NULL, crc32c TEXT, state TEXT NOT NULL, pid INTEGER,
                    created REAL NOT NULL, last_used REAL NOT NULL);
                CREATE INDEX IF NOT EXISTS entries_lru ON entries (state, last_used);
                -- Running totals, kept by triggers so that no fill has to sum the whole index.
                CREATE TABLE IF NOT EXISTS usage (
                    id INTEGER PRIMARY KEY CHECK (id = 1), entries INTEGER NOT NULL,
                    bytes INTEGER NOT NULL, filling_bytes INTEGER NOT NULL);
                INSERT OR IGNORE INTO usage VALUES (1, 0, 0, 0);
                CREATE TRIGGER IF NOT EXISTS entries_insert AFTER INSERT ON entries BEGIN
                    UPDATE usage SET entries = entries + 1, bytes = bytes + NEW.size,
                        filling_bytes = filling_bytes + (NEW.state = 'filling') * NEW.size;
                END;
                CREATE TRIGGER IF NOT EXISTS entries_delete AFTER DELETE ON entries BEGIN
                    UPDATE usage SET entries = entries - 1, bytes = bytes - OLD.size,
                        filling_bytes = filling_bytes - (OLD.state = 'filling') * OLD.size;
                END;
                CREATE TRIGGER IF NOT EXISTS entries_update AFTER UPDATE OF size, state ON entries BEGIN
                    UPDATE usage SET bytes = bytes - OLD.size + NEW.size,
                        filling_bytes = filling_bytes - (OLD.state = 'filling') * OLD.size
                                                      + (NEW.state = 'filling') * NEW.size;
                END;
                """
            )
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self._recover()

    # -- per-process state (connections and locks never cross fork or pickle) -------------------

    @classmethod
    def existing(cls, root: str | os.PathLike[str], **options: Any) -> Cache:
        """An existing cache; :class:`CacheFolderError` rather than a new cache at a mistyped path."""
        if not (Path(root) / "index.sqlite").is_file():
            raise CacheFolderError(2, f"{Path(root).absolute()} is not a dataferry cache (it has no index.sqlite): "
                                      "check the path")
        return cls(root, **options)

    def _init_process_state(self) -> None:
        """Locks, connections, counters and the writer thread of this process. A forked child gets
        fresh ones at once (``os.register_at_fork``, as fsspec does): a lock some parent thread held
        at the fork would otherwise stay held in the child forever."""
        _LIVE.add(self)
        self._objects, self._locks, self._tmp = (str(self.root / sub) for sub in ("objects", "locks", "tmp"))
        self._pid = os.getpid()
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._writer = threading.RLock()
        self._touched: dict[str, float] = {}
        self._last_flush = time.time()
        self._stats = CacheStats()
        self._index_writer: _IndexWriter | None = None
        atexit.register(_flush_at_exit, weakref.ref(self))

    @property
    def _index(self) -> _IndexWriter:
        if self._pid != os.getpid():
            self._init_process_state()
        if self._index_writer is None or not self._index_writer.alive:
            with self._mutex:
                if self._index_writer is None or not self._index_writer.alive:
                    self._index_writer = _IndexWriter(self)
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

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.root / "index.sqlite", timeout=60, isolation_level=None,
                             check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA recursive_triggers=ON")  # so REPLACE's delete keeps the totals right
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

    # -- keys and paths ---------------------------------------------------------------------

    @staticmethod
    def key(source: Source, entry: Entry) -> str:
        """The entry's key: a hash of (source, name, version); object names never become paths."""
        return hashlib.sha256(_utf8(f"{source.uri}\0{entry.name}\0{entry.version}")).hexdigest()

    def _object_path(self, key: str) -> str:
        return f"{self._objects}/{key[:2]}/{key}"

    @contextlib.contextmanager
    def _fill_lock(self, key: str) -> Iterator[None]:
        """The fill lock of ``key``'s stripe, across threads and processes.

        A plain blocking ``flock`` (filelock's polling and fork bookkeeping serialise a pool of
        staging threads): a waiter sleeps in the kernel and wakes the moment the holder is done,
        and the kernel drops the lock when a holder dies, so a crash never wedges the others."""
        fd = os.open(f"{self._locks}/{key[:LOCK_STRIPES_HEX]}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def _entry(source: Source, item: Entry | str) -> Entry:
        return item if isinstance(item, Entry) else source.stat(item)

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
        key = self.key(source, entry)
        path = self._object_path(key)
        hit = True
        for _ in range(self.max_refetches + 3):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                hit = False
                if self.fill(source, entry) < 0:
                    return self._stream(source, entry)
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
        raise ChecksumError(f"{where(source, _printable(entry.name))}: the cached copy keeps coming back damaged")

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
            raise OSError(f"{where(source, _printable(entry.name))} ({entry.size} bytes) does not fit in the cache")
        return Path(self._object_path(self.key(source, entry)))

    def contains(self, source: Source, item: Entry) -> bool:
        return os.path.exists(self._object_path(self.key(source, item)))

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

    # -- filling ----------------------------------------------------------------------------

    def fill(self, source: Source, item: Entry | str) -> int:
        """Make sure the object is cached. Returns the bytes downloaded (0 if it was already
        there, -1 if it cannot fit in the budget). One download per object per machine: other
        threads and processes asking for it at the same time wait for this one."""
        entry = self._entry(source, item)
        key = self.key(source, entry)
        path = self._object_path(key)
        if os.path.exists(path):
            return 0
        t0 = time.perf_counter()
        with self._fill_lock(key):
            self._count(wait_s=time.perf_counter() - t0)
            if os.path.exists(path):
                return 0
            self._count(misses=1)
            refusal = self._reserve(source, entry, key)
            if refusal is not None:
                self._local.refusal = refusal.why
                return -1
            try:
                return self._download_into_place(source, entry, key, path)
            except BaseException as e:
                self._cancel_fill(key)
                if not _disk_full(e):
                    raise
                self._local.refusal = f"the cache's disk filled up during the download ({self._free()})"
                return -1

    @property
    def last_refusal(self) -> str:
        """Why this thread's last fill found no room (the reason a read streamed, or a stage skipped)."""
        return getattr(self._local, "refusal", "")

    def _cancel_fill(self, key: str) -> None:
        """Drop a failed fill's reservation; on a full disk the index may refuse even that, and the
        row waits for the next batch of index writes (or the next open) to go."""
        try:
            with self._write() as db:
                db.execute("DELETE FROM entries WHERE key = ? AND state = 'filling'", (key,))
        except sqlite3.OperationalError as e:
            if not _disk_full(e):
                raise
            self._index.forget(key)

    def _download_into_place(self, source: Source, entry: Entry, key: str, path: str) -> int:
        """Download to a temp file, verify, fsync, rename into place. The rename is atomic, so
        ``objects/`` only ever holds whole, verified files. (The folder is not fsynced: after a
        power cut a just-renamed file may be missing, never partial; it is fetched again.)"""
        tmp = f"{self._tmp}/{key}.{os.getpid()}.part"
        t0 = time.perf_counter()
        try:
            with open(tmp, "wb") as f:
                crc = self._download(source, entry, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._index.ready(crc, time.time(), key)
        self._count(bytes_from_source=entry.size, fetch_s=time.perf_counter() - t0)
        return entry.size

    def _download(self, source: Source, entry: Entry, out: BinaryIO) -> str:
        """Copy the object into ``out`` with retries (resuming) and checks; returns its CRC32C.
        The whole fill is bounded by ``retry_deadline_s`` (or a second per MB, if that is longer)."""
        limit = max(self.retry_deadline_s, entry.size / MIN_FILL_BYTES_PER_S)
        writer = _Hashing(out, time.monotonic() + limit)
        for attempt in range(self.max_refetches + 1):
            if attempt:
                writer.restart()
                self._count(refetches=1)
            self._copy_with_retries(source, entry, writer, limit)
            got = _b64(writer.crc)
            if writer.n != entry.size:
                why = f"got {writer.n} bytes, expected {entry.size}"
            elif entry.crc32c and got != entry.crc32c:
                why = f"crc32c {got}, expected {entry.crc32c}"
            else:
                return got
        raise ChecksumError(f"{where(source, _printable(entry.name))}: {why} after {self.max_refetches + 1} downloads; "
                            "the object or the connection is damaged. Nothing was cached.")

    def _copy_with_retries(self, source: Source, entry: Entry, writer: _Hashing, limit: float) -> None:
        attempts = Attempts()

        def on_error(exc: BaseException) -> None:
            attempts(exc)
            self._count(retries=1)

        def attempt() -> None:
            left = writer.deadline - time.monotonic()
            if left <= 0:
                raise FillTimeout(f"the deadline passed with {writer.n} bytes received")
            if writer.n < entry.size or entry.size == 0:
                if _takes_timeout(source):
                    source.fetch(entry, writer, start=writer.n, timeout=min(STALL_S, left))
                else:  # a Source written before fetch() took a timeout: the writer still keeps the deadline
                    source.fetch(entry, writer, start=writer.n)

        name = where(source, _printable(entry.name))
        try:
            retry_policy(limit, on_error, predicate=_source_blip)(attempt)()
        except RetryError as e:
            raise SourceError(f"{attempts.gave_up(f'{name}: the source', e.cause)}; nothing was cached.") from e.cause
        except FillTimeout as e:
            gave_up = attempts.gave_up(f"{name}: the download did not finish", e, "within")
            raise SourceError(f"{gave_up}; nothing was cached.") from e

    def _stream(self, source: Source, entry: Entry) -> bytes:
        warnings.warn(f"{where(source, _printable(entry.name))} ({entry.size / 1e6:.1f} MB) does not fit in the cache "
                      f"{self}: {self.last_refusal}; reading it straight from the source", CacheFullWarning,
                      stacklevel=3)
        buf = io.BytesIO()
        self._download(source, entry, buf)
        self._count(streamed=1, bytes_from_source=entry.size)
        return buf.getvalue()

    # -- budget -----------------------------------------------------------------------------

    def _reserve(self, source: Source, entry: Entry, key: str) -> Refusal | None:
        """Record a fill in progress, evicting least-recently-used entries to make room. While the
        room is held by readers or fills in flight, wait for it (up to ``ROOM_WAIT_S``); returns
        None when reserved, else why not."""
        if self.max_bytes is not None and entry.size > self.max_bytes:
            return Refusal(f"the object is larger than the whole budget (max_bytes={self.max_bytes})")
        deadline, pause = time.monotonic() + ROOM_WAIT_S, 0.05
        while True:
            now = time.time()
            try:
                refusal = self._index.reserve((key, source.uri, _printable(entry.name), entry.version, entry.size,
                                               os.getpid(), now, now))
            except sqlite3.OperationalError as e:
                if not _disk_full(e):
                    raise
                return Refusal(f"the cache's disk is full: its index could not grow ({self._free()})")
            if refusal is None or not refusal.transient or time.monotonic() > deadline:
                return refusal
            time.sleep(pause)
            pause = min(2 * pause, 1.0)

    def _free(self) -> str:
        return f"{shutil.disk_usage(self.root).free / 1e6:.1f} MB free in {self.root}"

    @staticmethod
    def _lru(db: sqlite3.Connection, batch: int = 256) -> Iterator[tuple[str, int]]:
        """Ready entries, least recently used first, fetched in batches."""
        last = -1.0
        while True:
            rows = db.execute("SELECT key, size, last_used FROM entries WHERE state = 'ready' AND last_used >= ? "
                              "ORDER BY last_used LIMIT ?", (last, batch)).fetchall()
            if not rows:
                return
            for key, size, used in rows:
                yield key, size
            if len(rows) < batch:
                return
            last = rows[-1][2]

    def _evict(self, db: sqlite3.Connection, key: str, doomed: list[tuple[str, int]]) -> bool:
        """Remove one entry's row unless a reader holds it. Runs inside a write transaction; the
        file goes on ``doomed``, to be unlinked by :func:`_release` once the transaction commits."""
        path = self._object_path(key)
        if not db.execute("SELECT 1 FROM entries WHERE key = ? AND state = 'ready'", (key,)).fetchone():
            return False  # already gone (the batch is a snapshot)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            db.execute("DELETE FROM entries WHERE key = ?", (key,))
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        doomed.append((path, fd))
        db.execute("DELETE FROM entries WHERE key = ?", (key,))
        self._count(evictions=1)
        return True

    def _discard(self, key: str) -> None:
        doomed: list[tuple[str, int]] = []
        try:
            with self._write() as db:
                db.execute("DELETE FROM entries WHERE key = ?", (key,))
                doomed.append((self._object_path(key), -1))
        except BaseException:
            _release(doomed, unlink=False)
            raise
        _release(doomed, unlink=True)

    def prune(self, max_bytes: int | None = None) -> int:
        """Evict least-recently-used entries (not those being read) until the cache holds at most
        ``max_bytes`` (default: its budget). Returns how many were evicted."""
        self._flush()
        limit = self.max_bytes if max_bytes is None else max_bytes
        if limit is None:
            return 0
        evicted = 0
        doomed: list[tuple[str, int]] = []
        try:
            with self._write() as db:
                used = db.execute("SELECT bytes FROM usage").fetchone()[0]
                for victim, size in self._lru(db):
                    if used <= limit:
                        break
                    if self._evict(db, victim, doomed):
                        used -= size
                        evicted += 1
        except BaseException:
            _release(doomed, unlink=False)
            raise
        _release(doomed, unlink=True)
        return evicted

    # -- recovery and checks ----------------------------------------------------------------

    def _recover(self) -> None:
        """Clean what crashed processes left: dead fills' temp files and index rows, rows whose
        file is missing, and files no row names (evicted by a process that died before unlinking)."""
        for tmp in (self.root / "tmp").iterdir():
            try:
                pid = int(tmp.name.split(".")[-2])
            except (ValueError, IndexError):
                pid = -1
            if pid != os.getpid() and not _pid_alive(pid):
                tmp.unlink(missing_ok=True)
        doomed: list[tuple[str, int]] = []
        with self._write() as db:
            self._reclaim_dead_fills(db, doomed)
        _release(doomed, unlink=True)
        for sub in sorted(os.listdir(self._objects)):
            files = set(os.listdir(f"{self._objects}/{sub}"))
            rows = dict(self._db().execute("SELECT key, state FROM entries WHERE key >= ? AND key < ?",
                                           (sub, sub + "g")).fetchall())
            missing = [k for k, state in rows.items() if state == "ready" and k not in files]
            if missing:
                with self._write() as db:
                    db.executemany("DELETE FROM entries WHERE key = ? AND state = 'ready'", [(k,) for k in missing])
            for name in files - rows.keys():
                self._remove_orphan(sub, name)

    def _reclaim_dead_fills(self, db: sqlite3.Connection, doomed: list[tuple[str, int]]) -> bool:
        """Inside a write transaction: finish or drop the fills of processes that died. A file
        renamed into place but not yet marked ready was verified before the rename, so a
        right-sized one is whole; anything else goes. True when anything changed."""
        changed = False
        for key, pid, size, crc in db.execute(
                "SELECT key, pid, size, crc32c FROM entries WHERE state = 'filling'").fetchall():
            if _pid_alive(pid):
                continue
            changed = True
            path = Path(self._object_path(key))
            if path.exists() and path.stat().st_size == size:
                db.execute("UPDATE entries SET state = 'ready', crc32c = ? WHERE key = ?",
                           (crc or _file_crc(path)[1], key))
            else:
                doomed.append((str(path), -1))
                db.execute("DELETE FROM entries WHERE key = ?", (key,))
        return changed

    def _remove_orphan(self, sub: str, name: str) -> bool:
        """Unlink ``objects/sub/name`` if no row names it. Its fill lock is held meanwhile: a fill
        holds it from before its row exists until after its rename, so none can be missed."""
        with self._fill_lock(name):
            if self._db().execute("SELECT 1 FROM entries WHERE key = ?", (name,)).fetchone():
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self._objects}/{sub}/{name}")
            return True

    def verify(self) -> VerifyReport:
        """Re-read every cached object and check size and CRC32C; remove bad entries (they are
        fetched again on the next read) and files the index does not know. Safe while other
        processes fill, read and evict: an entry evicted meanwhile is not bad, and a file is an
        orphan only if no row names it while its fill lock is held. Returns the report."""
        self._flush()
        report = VerifyReport()
        for sub in sorted(os.listdir(self._objects)):
            rows = self._db().execute("SELECT key, source, name, size, crc32c FROM entries "
                                      "WHERE state = 'ready' AND key >= ? AND key < ?", (sub, sub + "g")).fetchall()
            for key, source, name, size, crc in rows:
                try:
                    n, got = _file_crc(Path(self._object_path(key)))
                except FileNotFoundError:
                    if self._db().execute("SELECT 1 FROM entries WHERE key = ? AND state = 'ready'",
                                          (key,)).fetchone():
                        report.checked += 1
                        report.bad.append((source, name, "file missing"))
                        self._discard(key)
                    continue  # evicted meanwhile: not bad
                report.checked += 1
                why = (f"size {n}, expected {size}" if n != size
                       else f"crc32c {got}, expected {crc}" if crc and got != crc else "")
                if why:
                    report.bad.append((source, name, why))
                    self._discard(key)
            known = {row[0] for row in rows}
            for name in os.listdir(f"{self._objects}/{sub}"):
                if name not in known and self._remove_orphan(sub, name):
                    report.orphans_removed += 1
        return report

    def clear(self) -> None:
        """Remove every ready entry. Fills in progress keep theirs; files being read stay readable
        until closed. The index lock is held only to delete rows, never while files are removed."""
        self._flush()
        with self._write() as db:
            keys = [key for (key,) in db.execute("SELECT key FROM entries WHERE state = 'ready'")]
            db.execute("DELETE FROM entries WHERE state = 'ready'")
        _release([(self._object_path(key), -1) for key in keys], unlink=True)
        with self._mutex:
            self._touched.clear()

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

