"""A process's lease on the room of an uncapped cache: room for many fills in one request.

Without a byte cap the one limit on a fill is ``min_free_bytes`` on the cache's disk. Asking the
index for each object's room is a round trip to its writer thread and a SQLite transaction, which
cost a reader filling small objects from a folder more than copying them (about 200 us per file,
profiled). So a process reserves ``LEASE_BYTES`` at a time, as one index row per open cache
(``lease.PID.N``: a fill in progress to ``min_free_bytes``, so every process counts the room as
taken; no cap counts it, for it holds no entry), and its fills on a reader's
thread draw on it with no I/O. The writer records each finished fill and takes its size off the
lease in the same transaction (a fill given up gives its room back to the lease), so the lease's
row covers what is drawn and not yet recorded. The lease goes when the index writer has had nothing
to write for a few seconds (so an idle notebook holds no room), when its cache is dropped or its
process exits, or, if the process dies, it is reclaimed like any dead fill.

With a cap (``max_bytes``) every fill reserves exactly its size, so the cap holds to the byte; so
does an object over ``LEASE_OBJECT_MAX``, whose round trip is small beside its download.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from dataferry.cache.requests import Forget, Reserve
from dataferry.cache.store import Row, lease_key

__all__ = ["Lease", "LEASE_BYTES", "LEASE_OBJECT_MAX", "Ask"]

#: How a lease reaches the index writer: ``ask(request, answer)`` queues a request whose outcome lands on
#: the future ``answer`` (:meth:`dataferry.cache.index.IndexWriter.ask`); it raises RuntimeError once the
#: index is closed.
Ask = Callable[[Reserve | Forget, Future], None]

LEASE_BYTES = 16 << 20
LEASE_OBJECT_MAX = 4 << 20
REFUSED_PAUSE_S = 1.0  # after a refused lease, fills reserve their own room this long before asking again
_NUMBERS = itertools.count()


class Lease:
    """This process's lease on one cache folder's room (a forked child makes its own)."""

    def __init__(self, ask: Ask, enabled: bool) -> None:
        """``ask`` reaches the index writer; ``enabled`` is False under a byte cap, where every fill reserves
        exactly its own size."""
        self._ask = ask
        self.pid = os.getpid()
        self.key = lease_key(self.pid, next(_NUMBERS))  # one per open cache: two never share a row
        self.enabled = enabled
        self._credit = 0  # leased bytes not drawn yet
        self._pending = 0  # bytes drawn and not yet recorded (nor given back)
        self._held = False  # whether the index has a row for this lease
        self._refused_until = 0.0
        self._mutex = threading.Lock()  # never held while waiting on the index writer, which takes it too
        self._growing = threading.Lock()  # one request for more room at a time

    def __repr__(self) -> str:
        return f"<Lease {self.key}: {self._credit} B to draw>"

    def draw(self, size: int) -> str | None:
        """Take ``size`` bytes of room from the lease (asking for more when it runs short); the lease's
        key, or None when the fill must reserve its own room (a cap, a large object, no room to lease)."""
        if not self.enabled or size > LEASE_OBJECT_MAX:
            return None
        while True:
            with self._mutex:
                if self._credit >= size:
                    self._credit -= size
                    self._pending += size
                    return self.key
                if time.monotonic() < self._refused_until:
                    return None
            with self._growing:
                with self._mutex:
                    short = self._credit < size
                if short and not self._extend():
                    return None

    def give_back(self, size: int) -> None:
        """A fill that drew ``size`` bytes failed before it was recorded: the room is free again."""
        with self._mutex:
            self._credit += size
            self._pending -= size

    def recorded(self, size: int) -> None:
        """The index writer recorded fills of ``size`` bytes drawn here (and took them off the lease's row)."""
        with self._mutex:
            self._pending -= size

    def let_go_if_idle(self) -> bool:
        """On the index writer's thread, after a while with nothing to write: give up the lease if nothing
        drawn is waiting to be recorded. True when the caller must now delete its row."""
        with self._mutex:
            if not self._held or self._pending:
                return False
            self._held, self._credit = False, 0
            return True

    def _extend(self) -> bool:
        now = time.time()
        answer: Future = Future()
        try:
            self._ask(Reserve(Row(self.key, "", "lease", "", LEASE_BYTES, None, self.pid, now, now)), answer)
            refused = answer.result() is not None
        except (sqlite3.OperationalError, RuntimeError):  # an index that cannot grow, a writer that stopped
            refused = True  # the fill reserves its own room, which says why it cannot
        with self._mutex:
            if refused:
                self._refused_until = time.monotonic() + REFUSED_PAUSE_S
            else:
                self._credit += LEASE_BYTES
                self._held = True
        return not refused

    def end(self) -> None:
        """Return the lease (once this process's fills are recorded: after the index's flush)."""
        with self._mutex:
            if not self._held:
                return
            self._held, self._credit = False, 0
        answer: Future = Future()
        self._ask(Forget(self.key, self.pid), answer)
        answer.result()
