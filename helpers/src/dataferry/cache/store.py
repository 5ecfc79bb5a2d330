"""The index file: one SQLite database (WAL) per cache folder, its schema and its row type.

Rows are entries (:class:`Row`: key, source, name, version, size, crc32c, state, pid, created, last_used); running
totals are kept by triggers, so no fill has to sum the whole index. The statements on them are
:mod:`dataferry.cache.entries`'. A file named by a row that
is deleted is unlinked only after the deletion commits (:func:`release`): a crash or a failed
statement can roll rows back, never bring back a file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

from dataferry.cache.errors import CacheFolderError, CacheIndexWarning
from dataferry.cache.layout import Layout
from dataferry.cache.locks import hold_across_fork

__all__ = ["SCHEMA_VERSION", "SCHEMA", "Row", "connect", "create", "damaged", "still_damaged", "release", "close",
           "set_aside", "has_schema", "LEASE_PREFIX", "is_lease", "lease_key"]

SCHEMA_VERSION = 1
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


class Row(NamedTuple):
    """An entry of the index, in the columns of :data:`dataferry.cache.store.SCHEMA` (less its state, which the
    statement that writes it decides): a reservation's has no ``crc32c`` yet; a lease's ``name`` is ``"lease"``."""

    key: str
    source: str
    name: str
    version: str
    size: int
    crc32c: str | None
    pid: int
    created: float
    last_used: float


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the folder's index, in WAL mode. Processes that open a new index at once race
    to switch it to WAL, and SQLite answers the losers 'database is locked' at once, without its busy
    wait: they try again, with backoff, for up to ``OPEN_TIMEOUT_S``."""
    deadline, pause = time.monotonic() + OPEN_TIMEOUT_S, 0.005
    while True:
        with _OPENING.write_lock:
            db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
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
                    raise CacheFolderError(errno.EBUSY, f"the index of the cache {path.parent} stayed locked for "
                                                        f"{OPEN_TIMEOUT_S:g} s: another process holds it (a hung one?); "
                                                        "stop it, or use another cache folder") from None
            except BaseException:
                db.close()
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(2 * pause, 0.5)


def close(db: sqlite3.Connection) -> None:
    """Close a connection (see :data:`_OPENING`)."""
    with _OPENING.write_lock:
        db.close()


class _Opening:
    """SQLite takes a process-wide mutex to open or close a database file. A fork while another thread
    holds it leaves it held for good in the child, whose first connection then hangs (seen: a DataLoader
    worker forked as an index writer closed its connection). So connections open and close under this
    lock, which the process holds across a fork, after every index's write lock."""

    write_lock = threading.Lock()


_OPENING = _Opening()
hold_across_fork(_OPENING, last=True)


def _busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


def damaged(e: sqlite3.DatabaseError) -> bool:
    """Whether ``e`` says the index file is not a sound database (garbage, corrupt, or truncated: a short
    read), not that its disk is failing (any other I/O error)."""
    if getattr(e, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_IOERR_SHORT_READ"):
        return True
    return any(why in str(e) for why in ("not a database", "malformed", "database corrupt"))


#: The rows of processes' leases on room (:mod:`dataferry.cache.lease`) are keyed ``lease.PID.N``: the one place
#: that says what a lease's key is (:data:`dataferry.cache.entries.LEASES` is the same as a key range in SQL).
LEASE_PREFIX = "lease."


def is_lease(key: str) -> bool:
    return key.startswith(LEASE_PREFIX)


def lease_key(pid: int, number: int) -> str:
    return f"{LEASE_PREFIX}{pid}.{number}"


def has_schema(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'usage'").fetchone() is not None


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


def still_damaged(path: Path) -> bool:
    """Whether the index file ``path`` is still not a sound database (another process may have set it aside
    first): SQLite's ``quick_check`` reads every page (a count of rows may read none of the damaged ones)."""
    try:
        db = connect(path)
    except sqlite3.DatabaseError as e:
        return damaged(e)
    try:
        return [row[0] for row in db.execute("PRAGMA quick_check").fetchall()] != ["ok"]
    except sqlite3.DatabaseError as e:
        return damaged(e)
    finally:
        close(db)


def set_aside(layout: Layout, error: sqlite3.DatabaseError) -> None:
    """The index file is not a sound database: move it (and its WAL) aside for a post-mortem and warn in one
    line; the next connection starts a new, empty one. The objects it named are then orphans, removed by
    recovery and downloaded again when read. One process does it, under a lock, after checking again that
    nobody did it first (then this one only reconnects, quietly)."""
    fd = os.open(layout.index_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not still_damaged(layout.index):
            return
        aside = layout.set_aside_path(time.strftime('%Y%m%d-%H%M%S'))
        for extra in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{layout.index}{extra}", f"{aside}{extra}")
        db = connect(layout.index)  # the new one, made while no other process can set it aside again
        try:
            create(db)
        finally:
            close(db)
    finally:
        os.close(fd)
    warnings.warn(f"the cache's index {layout.index} was damaged ({error}); set aside as {aside.name}, and a new one "
                  "started: cached objects are downloaded again when read", CacheIndexWarning, stacklevel=2)
