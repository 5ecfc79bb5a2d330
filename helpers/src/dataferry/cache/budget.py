"""Budget and eviction: room for a fill under ``max_bytes`` and ``min_free_bytes``, made by
evicting the least recently used entries no reader holds (entries demoted as used up go first). Fills in progress count, fillers that
died do not, and a fill that finds the room held by readers or fills in flight waits for it a while.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dataferry.cache.fill import disk_full
from dataferry.cache.index import release
from dataferry.cache.layout import printable
from dataferry.errors import byte_count
from dataferry.sources import Entry, Source

__all__ = ["Budget", "Refusal", "DEFAULT_MIN_FREE_BYTES", "ROOM_WAIT_S"]

DEFAULT_MIN_FREE_BYTES = 1 << 30  # leave 1 GiB free on the cache's disk
ROOM_WAIT_S = 10.0  # how long a fill waits for room held by readers or fills in flight


@dataclass(frozen=True)
class Refusal:
    """Why a fill found no room; ``transient`` when readers or fills in flight hold the room."""

    why: str
    transient: bool = False


class Budget:
    """The :class:`~dataferry.cache.Cache` methods that decide room."""

    def _reserve(self, source: Source, entry: Entry, key: str) -> Refusal | None:
        """Record a fill in progress, evicting least-recently-used entries to make room. While the
        room is held by readers or fills in flight, wait for it (up to ``ROOM_WAIT_S``); returns
        None when reserved, else why not."""
        for pause in self._room_waits(entry):
            try:
                refusal = self._index.reserve(self._reservation(source, entry, key))
            except sqlite3.OperationalError as e:
                refusal = self._index_full(e)
            if refusal is None or not refusal.transient or pause is None:
                return refusal
            time.sleep(pause)
        return self._too_big(entry)

    def _room_waits(self, entry: Entry) -> Iterator[float | None]:
        """One item per try at a reservation: the pause before the next try, None for the last
        (room held by readers or fills in flight is waited for up to ``ROOM_WAIT_S``); no tries
        at all for an object larger than the whole budget."""
        if self._too_big(entry):
            return
        deadline, pause = time.monotonic() + ROOM_WAIT_S, 0.05
        while time.monotonic() < deadline:
            yield pause
            pause = min(2 * pause, 1.0)
        yield None

    def _too_big(self, entry: Entry) -> Refusal | None:
        if self.max_bytes is not None and entry.size > self.max_bytes:
            return Refusal(f"the object is larger than the whole budget (max_bytes={self.max_bytes})")
        return None

    def _reservation(self, source: Source, entry: Entry, key: str) -> tuple:
        now = time.time()
        return (key, source.uri, printable(entry.name), entry.version, entry.size, self._pid, now, now)

    def _index_full(self, e: sqlite3.OperationalError) -> Refusal:
        """The refusal for an index that could not grow on a full disk (any other error is raised)."""
        if not disk_full(e):
            raise e
        return Refusal(f"the cache's disk is full: its index could not grow ({self._free()})")

    def _free(self) -> str:
        return f"{shutil.disk_usage(self.root).free / 1e6:.1f} MB free in {self.root}"

    def _decide(self, db: sqlite3.Connection, wants: list, doomed: list) -> list[tuple[Future, Any]]:
        """Inside the index writer's transaction: accept or refuse each reservation, evicting LRU
        entries (and reclaiming dead fills) for room; a refusal says which limit applied."""
        answers: list[tuple[Future, Any]] = []
        used, filling = db.execute("SELECT bytes, filling_bytes FROM usage").fetchone()
        free = shutil.disk_usage(self.root).free - filling
        victims = None
        reclaimed = False
        held = 0  # entries that could not be evicted because a reader holds them
        accepted = []
        for row, fut in wants:
            size = row[4]

            def over_budget() -> int:
                return used + size - self.max_bytes if self.max_bytes is not None else 0

            def short() -> int:
                return max(over_budget(), self.min_free_bytes - (free - size), 0)

            if short() and not reclaimed:  # room held by fillers that died is room
                reclaimed = True
                if self._reclaim_dead_fills(db, doomed):
                    used, filling = db.execute("SELECT bytes, filling_bytes FROM usage").fetchone()
                    free = shutil.disk_usage(self.root).free - filling
            if short():
                victims = victims or self._lru(db)
                for victim, vsize in victims:
                    if self._evict(db, victim, doomed):
                        used, free = used - vsize, free + vsize
                        if not short():
                            break
                    else:
                        held += 1
            if short():
                if over_budget() > 0:
                    why = (f"max_bytes={self.max_bytes} would be exceeded ({used} B cached or being filled; the "
                           "CLI's --max-bytes)")
                else:
                    why = (f"min_free_bytes={self.min_free_bytes} would be crossed on the cache's disk ({max(free, 0)} B "
                           f"free there, after {filling} B of fills in flight; the CLI's --min-free-bytes)")
                answers.append((fut, Refusal(why, transient=bool(held or filling))))
                continue
            used, free = used + size, free - size
            accepted.append(row)
            answers.append((fut, None))
        db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, NULL, 'filling', ?, ?, ?)", accepted)
        return answers

    @staticmethod
    def _lru(db: sqlite3.Connection, batch: int = 256) -> Iterator[tuple[str, int]]:
        """Ready entries, least recently used first (demoted ones before all others), in batches."""
        last = float("-inf")
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
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)

    def demote(self, source: Source, items: Iterable[Entry]) -> None:
        """Mark entries used up for now (a shard read this epoch): when room is needed they go before
        every other entry, the most recently demoted first, so what was kept from an earlier pass
        and is not yet read again stays. A later read of an entry undoes its demotion."""
        now = time.time()
        self._rank_now({self.key(source, e): -now for e in items})

    def will_read(self, source: Source, items: Sequence[Entry]) -> None:
        """Entries about to be read in this order (a pass over shards): when room is needed they go after
        every entry demoted as used up and before every other, the one read last first, so a pass over
        more than fits keeps what it reads soonest. Reading an entry undoes this, as it undoes a demotion."""
        self._rank_now({self.key(source, e): -(i + 1.0) for i, e in enumerate(items)})  # above -time, below uses

    def _rank_now(self, ranks: dict[str, float]) -> None:
        """Send these LRU times to the index now, after the uses noted before them (the order they happened)."""
        with self._mutex:
            self._touched.update(ranks)
            touched, self._touched = self._touched, {}
            self._last_flush = time.time()
        self._index.touch(touched)

    def prune(self, max_bytes: int | None = None) -> int:
        """Evict least-recently-used entries (not those being read) until the cache holds at most
        ``max_bytes`` (default: its budget). Returns how many were evicted."""
        limit = self.max_bytes if max_bytes is None else byte_count("max_bytes", max_bytes)
        self._flush()
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
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)
        return evicted
