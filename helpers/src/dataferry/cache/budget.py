"""Budget and eviction: room for a fill under ``max_bytes`` and ``min_free_bytes``, made by
evicting the least recently used entries no reader holds (entries demoted as used up go first).
Fills in progress count, fillers that died do not. The index's writer thread asks :meth:`Budget.decide`
inside its transaction; nothing here holds a connection or a thread of its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dataferry.cache import entries
from dataferry.cache.counters import Counters
from dataferry.cache.errors import disk_full
from dataferry.cache.layout import Layout
from dataferry.cache.entries import Doomed, lru
from dataferry.cache.store import Row
from dataferry.sources import Entry

__all__ = ["Budget", "Refusal", "lru", "DEFAULT_MIN_FREE_BYTES", "ROOM_WAIT_S"]

DEFAULT_MIN_FREE_BYTES = 1 << 30  # leave 1 GiB free on the cache's disk
ROOM_WAIT_S = 10.0  # how long a fill waits for room held by readers or fills in flight



@dataclass(frozen=True)
class Refusal:
    """Why a fill found no room; ``transient`` when readers or fills in flight hold the room."""

    why: str
    transient: bool = False


class Budget:
    """The room rules of one cache folder: ``max_bytes`` (None: no cap) and ``min_free_bytes``."""

    def __init__(self, layout: Layout, max_bytes: int | None, min_free_bytes: int, counters: Counters) -> None:
        self.layout, self.max_bytes, self.min_free_bytes, self.counters = layout, max_bytes, min_free_bytes, counters

    def __repr__(self) -> str:
        return f"Budget(max_bytes={self.max_bytes}, min_free_bytes={self.min_free_bytes})"

    def too_big(self, entry: Entry) -> Refusal | None:
        if self.max_bytes is not None and entry.size > self.max_bytes:
            return Refusal(f"the object is larger than the whole budget (max_bytes={self.max_bytes})")
        return None

    def room_waits(self, entry: Entry, patient: bool = True) -> Iterator[float | None]:
        """One item per try at a reservation: the pause before the next try, None for the last
        (room held by readers or fills in flight is waited for up to ``ROOM_WAIT_S``; not at all
        unless ``patient``: one try); no tries at all for an object larger than the whole budget."""
        if self.too_big(entry):
            return
        if not patient:
            yield None
            return
        deadline, pause = time.monotonic() + ROOM_WAIT_S, 0.05
        while time.monotonic() < deadline:
            yield pause
            pause = min(2 * pause, 1.0)
        yield None

    def free(self) -> str:
        return f"{shutil.disk_usage(self.layout.root).free / 1e6:.1f} MB free in {self.layout.root}"

    def index_full(self, e: sqlite3.OperationalError) -> Refusal:
        """The refusal for an index that could not grow on a full disk (any other error is raised)."""
        if not disk_full(e):
            raise e
        return Refusal(f"the cache's disk is full: its index could not grow ({self.free()})")

    def decide(self, db: sqlite3.Connection, wants: list[tuple[Row, Any]], doomed: Doomed) -> list[tuple[Any, Any]]:
        """Inside the index writer's transaction: accept or refuse each reservation (a row and the
        future that waits for its answer), evicting LRU entries (and reclaiming dead fills) for room;
        a refusal says which limit applied."""
        answers: list[tuple[Any, Any]] = []
        used, filling = entries.used(db)
        free = shutil.disk_usage(self.layout.root).free - filling
        victims = None
        reclaimed = False
        held = 0  # entries that could not be evicted because a reader holds them
        accepted: list[Row] = []
        for row, fut in wants:
            size = row.size

            def over_budget() -> int:
                return used + size - self.max_bytes if self.max_bytes is not None else 0

            def short() -> int:
                return max(over_budget(), self.min_free_bytes - (free - size), 0)

            if short() and not reclaimed:  # room held by fillers that died is room
                reclaimed = True
                if entries.reclaim_dead_fills(db, self.layout, doomed):
                    used, filling = entries.used(db)
                    free = shutil.disk_usage(self.layout.root).free - filling
            if short():
                victims = victims or lru(db)
                for victim, vsize in victims:
                    if self.evict(db, victim, doomed):
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
        entries.reserve(db, accepted)
        return answers

    def evict(self, db: sqlite3.Connection, key: str, doomed: Doomed) -> bool:
        """Remove one entry's row unless a reader holds it. Runs inside a write transaction; the
        file goes on ``doomed``, to be unlinked by :func:`~dataferry.cache.store.release` once the
        transaction commits."""
        path = self.layout.object_path(key)
        if not entries.is_ready(db, key):
            return False  # already gone (the batch is a snapshot)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            entries.delete(db, key)
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        doomed.append((path, fd))
        entries.delete(db, key)
        self.counters.add(evictions=1)
        return True

    def prune(self, db: sqlite3.Connection, limit: int, doomed: Doomed) -> int:
        """Inside a write transaction: evict LRU entries no reader holds until at most ``limit`` bytes are
        cached. Returns how many were evicted."""
        evicted = 0
        used = entries.cached_bytes(db)
        for victim, size in lru(db):
            if used <= limit:
                break
            if self.evict(db, victim, doomed):
                used -= size
                evicted += 1
        return evicted
