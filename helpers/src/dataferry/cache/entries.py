"""Every SQL statement on the index's ``entries`` (and its running totals in ``usage``), one function each.

The schema and the row type are :mod:`dataferry.cache.store`'s; this module is what the index writer, the
budget, recovery and the index's reads say to those tables. Writes run inside the caller's transaction
(:meth:`dataferry.cache.index.Index.write`, or the index writer's batch).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dataferry.cache.checksum import file_crc
from dataferry.cache.layout import Layout
from dataferry.cache.requests import Forget, Placed, Ready
from dataferry.cache.store import Row, is_lease
from dataferry.host import pid_alive

__all__ = ["LEASES", "leased", "used", "cached_bytes", "usage", "rows", "stored_crc", "lru", "reserve", "mark_ready",
           "record_placed", "touch", "forget", "drop_lease", "is_ready", "is_named", "delete", "shelf_states",
           "ready_on_shelf", "drop_missing", "clear_ready", "recount", "reclaim_dead_fills", "Doomed"]

#: The rows of processes' leases on room, by key range (:func:`dataferry.cache.store.is_lease` on one key).
LEASES = "key >= 'lease.' AND key < 'lease/'"

Doomed = list[tuple[str, int]]  # files to unlink once the transaction that dropped their rows commits


# -- totals -----------------------------------------------------------------------------------------------------

def leased(db: sqlite3.Connection) -> tuple[int, int]:
    """(rows, bytes) of processes' leases on room: counted by the budget, not entries of the cache."""
    return db.execute(f"SELECT count(*), coalesce(sum(size), 0) FROM entries WHERE {LEASES}").fetchone()


def used(db: sqlite3.Connection) -> tuple[int, int]:
    """(bytes of entries and fills in progress, bytes yet to be written): a lease is room yet to be written
    on the disk, but no entry under a cap."""
    total, filling = db.execute("SELECT bytes, filling_bytes FROM usage").fetchone()
    return total - leased(db)[1], filling


def cached_bytes(db: sqlite3.Connection) -> int:
    """Bytes of entries and fills in progress, not leases."""
    return db.execute("SELECT bytes FROM usage").fetchone()[0] - leased(db)[1]


def usage(db: sqlite3.Connection) -> tuple[int, int]:
    """(entries, bytes), fills in progress counted, leases not: one statement, one snapshot."""
    return db.execute("SELECT entries - n, bytes - b FROM usage, (SELECT count(*) AS n, coalesce(sum(size), 0) AS b "
                      f"FROM entries WHERE {LEASES})").fetchone()


def recount(db: sqlite3.Connection) -> None:
    """Set the running totals from the rows (any drift goes)."""
    db.execute("""UPDATE usage SET
        entries = (SELECT count(*) FROM entries), bytes = (SELECT coalesce(sum(size), 0) FROM entries),
        filling_bytes = (SELECT coalesce(sum(size), 0) FROM entries WHERE state = 'filling')""")


# -- reads ------------------------------------------------------------------------------------------------------

def rows(db: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every entry (not leases), most recently used first."""
    cur = db.execute("SELECT source, name, version, size, crc32c, state, last_used FROM entries "
                     f"WHERE NOT ({LEASES}) ORDER BY last_used DESC")
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]


def stored_crc(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT crc32c FROM entries WHERE key = ?", (key,)).fetchone()
    return row[0] if row and row[0] else None


def is_ready(db: sqlite3.Connection, key: str) -> bool:
    return db.execute("SELECT 1 FROM entries WHERE key = ? AND state = 'ready'", (key,)).fetchone() is not None


def is_named(db: sqlite3.Connection, key: str) -> bool:
    """Whether any row (ready, filling or a lease) names ``key``."""
    return db.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone() is not None


def lru(db: sqlite3.Connection, batch: int = 256) -> Iterator[tuple[str, int]]:
    """Ready entries, least recently used first (demoted ones before all others), in batches."""
    last = float("-inf")
    while True:
        found = db.execute("SELECT key, size, last_used FROM entries WHERE state = 'ready' AND last_used >= ? "
                           "ORDER BY last_used LIMIT ?", (last, batch)).fetchall()
        if not found:
            return
        for key, size, _ in found:
            yield key, size
        if len(found) < batch:
            return
        last = found[-1][2]


def shelf_states(db: sqlite3.Connection, shelf: str) -> dict[str, str]:
    """Key -> state of the rows whose files live on ``shelf`` (keys from ``shelf`` up to ``shelf + 'g'``)."""
    return dict(db.execute("SELECT key, state FROM entries WHERE key >= ? AND key < ?", (shelf, shelf + "g")).fetchall())


def ready_on_shelf(db: sqlite3.Connection, shelf: str) -> list[tuple[str, str, str, int, str | None]]:
    """(key, source, name, size, crc32c) of the ready entries on ``shelf``."""
    return db.execute("SELECT key, source, name, size, crc32c FROM entries "
                      "WHERE state = 'ready' AND key >= ? AND key < ?", (shelf, shelf + "g")).fetchall()


# -- writes -----------------------------------------------------------------------------------------------------

def reserve(db: sqlite3.Connection, accepted: list[Row]) -> None:
    """Rows of fills in progress, each holding its room; a lease's row grows by what it asks."""
    sql = "INSERT {} INTO entries VALUES (?, ?, ?, ?, ?, ?, 'filling', ?, ?, ?){}"
    db.executemany(sql.format("OR REPLACE", ""), [row for row in accepted if not is_lease(row.key)])
    db.executemany(sql.format("", " ON CONFLICT (key) DO UPDATE SET size = size + excluded.size"),
                   [row for row in accepted if is_lease(row.key)])


def mark_ready(db: sqlite3.Connection, ready: Iterable[Ready]) -> None:
    db.executemany("UPDATE entries SET state = 'ready', crc32c = ?, last_used = ? WHERE key = ?",
                   [(r.crc32c, r.when, r.key) for r in ready])


def record_placed(db: sqlite3.Connection, placed: list[Placed]) -> None:
    """Fills on a lease, durable in place: their rows, ready, and their sizes taken off their leases."""
    db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, 'ready', ?, ?, ?)", [p.row for p in placed])
    db.executemany("UPDATE entries SET size = max(size - ?, 0) WHERE key = ?", [(p.row.size, p.lease) for p in placed])


def touch(db: sqlite3.Connection, touched: dict[str, float]) -> None:
    db.executemany("UPDATE entries SET last_used = ? WHERE key = ?", [(t, k) for k, t in touched.items()])


def forget(db: sqlite3.Connection, forgets: Iterable[Forget]) -> None:
    """Failed fills' reservations (a fill of this process that finished meanwhile keeps its row)."""
    db.executemany("DELETE FROM entries WHERE key = ? AND state = 'filling' AND pid = ?",
                   [(f.key, f.pid) for f in forgets])


def drop_lease(db: sqlite3.Connection, key: str, pid: int) -> None:
    db.execute("DELETE FROM entries WHERE key = ? AND pid = ?", (key, pid))


def delete(db: sqlite3.Connection, key: str) -> None:
    db.execute("DELETE FROM entries WHERE key = ?", (key,))


def drop_missing(db: sqlite3.Connection, keys: list[str]) -> None:
    """Ready rows whose files are gone."""
    db.executemany("DELETE FROM entries WHERE key = ? AND state = 'ready'", [(k,) for k in keys])


def clear_ready(db: sqlite3.Connection) -> list[str]:
    """Drop every ready entry; their keys."""
    keys = [key for (key,) in db.execute("SELECT key FROM entries WHERE state = 'ready'")]
    db.execute("DELETE FROM entries WHERE state = 'ready'")
    return keys


def reclaim_dead_fills(db: sqlite3.Connection, layout: Layout, doomed: Doomed) -> bool:
    """Finish or drop the fills of processes that died. A file renamed into place but not yet marked ready was
    verified before the rename, so a right-sized one is whole; anything else goes. True when anything changed."""
    changed = False
    for key, pid, size, crc in db.execute(
            "SELECT key, pid, size, crc32c FROM entries WHERE state = 'filling'").fetchall():
        if pid_alive(pid):
            continue
        changed = True
        path = Path(layout.object_path(key))
        if path.exists() and path.stat().st_size == size:
            db.execute("UPDATE entries SET state = 'ready', crc32c = ? WHERE key = ?",
                       (crc or file_crc(path)[1], key))
        else:
            doomed.append((str(path), -1))
            delete(db, key)
    return changed
