"""The index: one SQLite database (WAL) per cache folder, and the thread that writes it.

Rows are entries (key, source, name, version, size, crc32c, state, pid, last_used); running
totals are kept by triggers, so no fill has to sum the whole index. Writes go through one
:class:`IndexWriter` thread per process, in batches ("group commit"), and a file named by a row
that is deleted is unlinked only after the deletion commits (:func:`release`): a crash or a
failed statement can roll rows back, never bring back a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import queue
import random
import sqlite3
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.cache.errors import CacheFolderError
from dataferry.cache.fill import disk_full

if TYPE_CHECKING:
    from dataferry.cache.core import Cache

__all__ = ["SCHEMA_VERSION", "connect", "create", "damaged", "recount", "release", "IndexWriter", "FLUSH_EVERY", "FLUSH_S"]

SCHEMA_VERSION = 1
FLUSH_EVERY = 256
FLUSH_S = 2.0
IDLE_CHECK_S = 5.0
OPEN_TIMEOUT_S = 60.0
SCHEMA = """
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


def connect(root: Path) -> sqlite3.Connection:
    """A connection to the folder's index, in WAL mode. Processes that open a new index at once race
    to switch it to WAL, and SQLite answers the losers 'database is locked' at once, without its busy
    wait: they try again, with backoff, for up to ``OPEN_TIMEOUT_S``."""
    deadline, pause = time.monotonic() + OPEN_TIMEOUT_S, 0.005
    while True:
        db = sqlite3.connect(root / "index.sqlite", timeout=60, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA recursive_triggers=ON")  # so REPLACE's delete keeps the totals right
            return db
        except sqlite3.OperationalError as e:
            db.close()
            if not _busy(e):
                raise
            if time.monotonic() > deadline:
                raise CacheFolderError(errno.EBUSY, f"the index of the cache {root} stayed locked for "
                                                    f"{OPEN_TIMEOUT_S:g} s: another process holds it (a hung one?); "
                                                    "stop it, or use another cache folder") from None
        except BaseException:
            db.close()
            raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(2 * pause, 0.5)


def _busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


def damaged(e: sqlite3.DatabaseError) -> bool:
    """Whether ``e`` says the index file is not a sound database (garbage, corrupt, or truncated: a short
    read), not that its disk is failing (any other I/O error)."""
    if getattr(e, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_IOERR_SHORT_READ"):
        return True
    return any(why in str(e) for why in ("not a database", "malformed", "database corrupt"))


def recount(db: sqlite3.Connection) -> None:
    """Inside a write transaction: set the running totals from the rows (any drift goes)."""
    db.execute("""UPDATE usage SET
        entries = (SELECT count(*) FROM entries), bytes = (SELECT coalesce(sum(size), 0) FROM entries),
        filling_bytes = (SELECT coalesce(sum(size), 0) FROM entries WHERE state = 'filling')""")


def create(db: sqlite3.Connection) -> None:
    """Make the tables, totals and triggers (once)."""
    db.executescript(SCHEMA)
    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def release(doomed: list[tuple[str, int]], unlink: bool) -> None:
    """Unlink evicted files (after their rows' deletion committed) and drop the locks that kept
    readers out meanwhile; ``unlink=False`` (the transaction failed) keeps every file."""
    for path, fd in doomed:
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if fd >= 0:
            os.close(fd)
    doomed.clear()


class IndexWriter:
    """One thread per process applies index writes in batches ("group commit").

    Under a pool of staging threads, a write per fill serialises every fill behind the GIL: each
    sqlite call releases it, and taking it back can wait a whole switch interval. Here a batch
    of any size costs a handful of sqlite calls. Reservations wait for their answer; finished
    fills and LRU times are fire-and-forget, and each queued write holds its cache, so a cache
    dropped (``stage(source, Cache(...))``) or a process exiting meanwhile still applies them
    (a crash before they are written leaves rows that ``Cache._recover`` completes at the next open).
    """

    def __init__(self, cache: Cache) -> None:
        self._cache_ref = weakref.ref(cache)  # the thread must not keep its cache alive
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._later: list = []  # finished fills and cancellations a full disk refused: tried with the next batch
        self._outbox: list = []  # writes of the download loop's current turn
        self._gate = threading.Lock()
        self._stopped = False  # set (under the gate) as the thread ends: later requests fail at once
        self._thread = threading.Thread(target=self._run, name="dataferry-index", daemon=True)
        self._thread.start()

    def reserve(self, row: tuple) -> bool:
        fut: Future = Future()
        self._put("reserve", row, fut)
        return self._wait(fut)

    async def reserve_async(self, row: tuple) -> Any:
        """:meth:`reserve` for a coroutine on the download loop. The answers of one batch come
        back to the loop in one hand-over; a writer that has stopped fails it at once."""
        fut = asyncio.get_running_loop().create_future()
        self._put("reserve", row, fut)
        return await fut

    def ready(self, crc: str, when: float, key: str) -> None:
        self._put("ready", (crc, when, key))

    def touch(self, touched: dict[str, float]) -> None:
        self._put("touch", touched)

    def forget(self, key: str) -> None:
        self._put("forget", key)

    def flush(self) -> None:
        fut: Future = Future()
        self._put("flush", None, fut)
        self._wait(fut)

    def _put(self, kind: str, args: Any, fut: Future | None = None) -> None:
        """Queue a write with a strong reference to its cache: the cache lives until it is applied.
        On the download loop, the writes of one turn of the loop go as one item (one wake-up of
        this thread, not one per fill)."""
        item = (kind, args, fut, self._cache_ref())
        if threading.current_thread().name != "dataferry-aio":
            self._enqueue(item)
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._send_outbox)
        self._outbox.append(item)

    def _send_outbox(self) -> None:
        items, self._outbox = self._outbox, []
        self._enqueue(("many", items, None, None))

    def _enqueue(self, item: tuple) -> None:
        with self._gate:
            if not self._stopped:
                self._queue.put(item)
                return
        _settle(_flat([item]), _stopped_error())

    def _stop_taking(self) -> None:
        """As the thread ends: fail what is queued and everything asked from now on."""
        with self._gate:
            self._stopped = True
        left = []
        with contextlib.suppress(queue.Empty):
            while True:
                left.append(self._queue.get_nowait())
        _settle(_flat(left) + self._later, _stopped_error())

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @staticmethod
    def _wait(fut: Future) -> Any:
        """The answer to a request (a writer that stops fails the requests it has not answered)."""
        return fut.result()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._stop_taking()

    def _serve(self) -> None:
        cache = self._cache_ref()
        if cache is None:
            return
        db = cache._connect()
        del cache
        while True:
            try:
                batch = [self._queue.get(timeout=IDLE_CHECK_S)]
            except queue.Empty:
                if self._cache_ref() is None:  # the cache is gone and nothing is queued: so is this thread
                    db.close()
                    return
                continue
            while len(batch) < 4096:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch, self._later = self._later + _flat(batch), []
            stop = any(item[0] == "stop" for item in batch)
            cache = self._cache_ref()  # alive: every queued item holds it
            try:
                self._commit(cache, db, [item for item in batch if item[0] != "stop"])
            finally:
                del cache, batch
            if stop:  # the thread ends after this batch
                db.close()
                return

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
                if batch[0][0] in ("ready", "forget") and disk_full(e):
                    self._later += batch  # the disk may have room again by the next batch
                _settle(batch, e)
                return
        for item in batch:
            self._commit(cache, db, [item])

    def _transaction(self, cache: Cache, db: sqlite3.Connection, batch: list) -> list[tuple[Future, Any]]:
        doomed: list[tuple[str, int]] = []
        try:
            with cache._write(db):
                answers = self._apply(cache, db, batch, doomed)
        except BaseException:
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)  # files go only once the rows naming them are gone for good
        return answers

    @staticmethod
    def _answer(answers: list[tuple[Any, Any]]) -> None:
        """Set each future's answer: a thread's at once, the download loop's in one hand-over per loop."""
        on_loops: dict[asyncio.AbstractEventLoop, list] = {}
        for fut, answer in answers:
            if isinstance(fut, asyncio.Future):
                on_loops.setdefault(fut.get_loop(), []).append((fut, answer, None))
            elif not fut.done():
                fut.set_result(answer)
        for loop, settled in on_loops.items():
            _hand_over(loop, settled)

    @staticmethod
    def _apply(cache: Cache, db: sqlite3.Connection, batch: list, doomed: list) -> list[tuple[Future, Any]]:
        ready = [args for kind, args, _, _ in batch if kind == "ready"]
        touched: dict[str, float] = {}
        for kind, args, _, _ in batch:
            if kind == "touch":
                touched.update(args)
        # Finished fills and recent uses first, so the LRU order the reservations see is current.
        db.executemany("UPDATE entries SET state = 'ready', crc32c = ?, last_used = ? WHERE key = ?", ready)
        db.executemany("UPDATE entries SET last_used = ? WHERE key = ?", [(t, k) for k, t in touched.items()])
        db.executemany("DELETE FROM entries WHERE key = ? AND state = 'filling'",
                       [(key,) for kind, key, _, _ in batch if kind == "forget"])
        answers: list[tuple[Future, Any]] = [(fut, None) for kind, _, fut, _ in batch if kind == "flush"]
        wants = [(args, fut) for kind, args, fut, _ in batch if kind == "reserve"]
        return answers + (cache._decide(db, wants, doomed) if wants else [])


def _flat(items: list) -> list:
    return [one for item in items for one in (item[1] if item[0] == "many" else (item,))]


def _stopped_error() -> RuntimeError:
    return RuntimeError("the cache's index writer thread stopped before answering; try again (a new one starts)")


def _settle(items: list, error: BaseException) -> None:
    """Fail the futures of ``items`` (queued requests) with ``error``."""
    on_loops: dict[asyncio.AbstractEventLoop, list] = {}
    for _, _, fut, _ in items:
        if isinstance(fut, asyncio.Future):
            on_loops.setdefault(fut.get_loop(), []).append((fut, None, error))
        elif fut is not None and not fut.done():
            fut.set_exception(error)
    for loop, settled in on_loops.items():
        _hand_over(loop, settled)


def _hand_over(loop: asyncio.AbstractEventLoop, settled: list) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop has no one left waiting
        loop.call_soon_threadsafe(_set_all, settled)


def _set_all(settled: list) -> None:
    for fut, answer, error in settled:
        if fut.done():
            continue
        if error is None:
            fut.set_result(answer)
        else:
            fut.set_exception(error)
