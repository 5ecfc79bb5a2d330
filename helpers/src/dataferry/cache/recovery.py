"""Recovery and verification: what crashed processes left is cleaned when a cache opens, and
``verify`` / ``clear`` are safe beside other processes that fill, read and evict.

A file is an orphan only if no row names it while its fill lock is held (a fill holds it from
before its row exists until after its rename); a ready row whose file is gone is dropped; a fill
whose process died is finished (a right-sized file was verified before its rename) or dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from dataferry.cache.checksum import file_crc
from dataferry.cache.errors import CacheIndexWarning
from dataferry.cache.index import connect, create, damaged, recount, release
from dataferry.host import pid_alive

__all__ = ["Recovery", "VerifyReport"]


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


def _still_damaged(root: Path) -> bool:
    """Whether the index in ``root`` still fails to open (another process may have set it aside first)."""
    try:
        db = connect(root)
    except sqlite3.DatabaseError as e:
        return damaged(e)
    try:
        create(db)
        db.execute("SELECT count(*) FROM entries").fetchone()
        return False
    except sqlite3.DatabaseError as e:
        return damaged(e)
    finally:
        db.close()


class Recovery:
    """The :class:`~dataferry.cache.Cache` methods that recover and check it."""

    def _recover(self) -> None:
        """Clean what crashed processes left: dead fills' temp files and index rows, rows whose
        file is missing, and files no row names (evicted by a process that died before unlinking)."""
        for tmp in (self.root / "tmp").iterdir():
            try:
                pid = int(tmp.name.split(".")[-2])
            except (ValueError, IndexError):
                pid = -1
            if pid != os.getpid() and not pid_alive(pid):
                tmp.unlink(missing_ok=True)
        self._finish_dead_fills()
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
        with self._write() as db:
            recount(db)

    def _set_index_aside(self, error: sqlite3.DatabaseError) -> None:
        """The index file is not a sound database: move it (and its WAL) aside for a post-mortem and warn
        in one line; the next open starts a new, empty one. The objects it named are then orphans, removed
        by recovery and downloaded again when read. One process does it, under a lock, after checking
        again that nobody did it first."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        index = self.root / "index.sqlite"
        fd = os.open(self.root / "locks" / "index.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _still_damaged(self.root):
                return
            aside = index.with_name(f"index.sqlite.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            for extra in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{index}{extra}", f"{aside}{extra}")
        finally:
            os.close(fd)
        warnings.warn(f"the cache's index {index} was damaged ({error}); set aside as {aside.name}, and a new one "
                      "started: cached objects are downloaded again when read", CacheIndexWarning, stacklevel=3)

    def _finish_dead_fills(self) -> None:
        doomed: list[tuple[str, int]] = []
        with self._write() as db:
            self._reclaim_dead_fills(db, doomed)
        release(doomed, unlink=True)

    def _reclaim_dead_fills(self, db: sqlite3.Connection, doomed: list[tuple[str, int]]) -> bool:
        """Inside a write transaction: finish or drop the fills of processes that died. A file
        renamed into place but not yet marked ready was verified before the rename, so a
        right-sized one is whole; anything else goes. True when anything changed."""
        changed = False
        for key, pid, size, crc in db.execute(
                "SELECT key, pid, size, crc32c FROM entries WHERE state = 'filling'").fetchall():
            if pid_alive(pid):
                continue
            changed = True
            path = Path(self._object_path(key))
            if path.exists() and path.stat().st_size == size:
                db.execute("UPDATE entries SET state = 'ready', crc32c = ? WHERE key = ?",
                           (crc or file_crc(path)[1], key))
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
        orphan only if no row names it while its fill lock is held; fills of processes that died
        are finished or dropped first. Returns the report."""
        self._flush()
        self._finish_dead_fills()
        report = VerifyReport()
        for sub in sorted(os.listdir(self._objects)):
            rows = self._db().execute("SELECT key, source, name, size, crc32c FROM entries "
                                      "WHERE state = 'ready' AND key >= ? AND key < ?", (sub, sub + "g")).fetchall()
            for key, source, name, size, crc in rows:
                try:
                    n, got = file_crc(Path(self._object_path(key)))
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
        release([(self._object_path(key), -1) for key in keys], unlink=True)
        with self._mutex:
            self._touched.clear()
