"""The index of one cache folder in this process: a SQLite connection per thread, write
transactions, LRU times noted in batches, and the thread that writes it in batches.

Writes go through one :class:`IndexWriter` thread per process ("group commit"); room for a fill is
decided there by the folder's :class:`~dataferry.cache.budget.Budget`. The index never calls back
into the cache that owns it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import multiprocessing.util
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from dataferry.cache import entries
from dataferry.cache.budget import Budget
from dataferry.cache.errors import CacheFolderError, disk_full
from dataferry.cache.layout import Layout
from dataferry.cache.lease import Ask, Lease
from dataferry.cache.locks import hold_across_fork
from dataferry.cache.placing import syncfs
from dataferry.cache.requests import Answer, Flush, Forget, Many, Placed, Queued, Ready, Request, Reserve, Stop, Touch
from dataferry.cache.store import Row, close, connect, create, damaged, has_schema, release, set_aside
from dataferry.errors import interrupted_at_exit

__all__ = ["Index", "IndexWriter", "FLUSH_EVERY", "FLUSH_S"]

T = TypeVar("T")

FLUSH_EVERY = 256
FLUSH_S = 2.0
IDLE_CHECK_S = 5.0
#: How long the writer gathers more placed fills or uses after one arrives, while no one waits for an answer: one
#: ``syncfs`` and one transaction for every fill of those milliseconds, not one for each file (epoch 1 from a
#: folder filled one file at a time per worker: a ``syncfs`` per file). Their fill locks are held that much longer,
#: and a use reaches the LRU order that much later.
GATHER_S = 0.02


def _flush_at_exit(ref: weakref.ref) -> None:
    index = ref()
    if index is not None and index.pid == os.getpid():
        try:
            index.flush()
            index.lease.end()
        except KeyboardInterrupt:
            interrupted_at_exit(f"writing the index of the cache {index.layout.root}: nothing is lost, the next open "
                                "completes it")
        except Exception:  # noqa: BLE001, S110 - never fail an exiting process
            pass


def _writer_of(ref: weakref.ReferenceType[Index]) -> Ask:
    """The lease's way to this index's writer, through a weak reference: the index owns its lease, and no
    cycle keeps either (or its writer thread) alive."""
    def ask(request: Reserve | Forget, answer: Future) -> None:
        index = ref()
        if index is None:
            raise RuntimeError("the cache's index is closed")
        index.writer.ask(request, answer)
    return ask


class Index:
    """The index of one cache folder, for this process (a forked child makes its own). ``write_lock``
    is held by every write transaction of this process, and across a fork; what is queued for it is
    written at exit, and its :class:`~dataferry.cache.lease.Lease` returned: at a normal exit and at a
    multiprocessing child's (a DataLoader worker's), which runs no ``atexit``."""

    def __init__(self, layout: Layout, budget: Budget) -> None:
        self.layout, self.budget = layout, budget
        self.pid = os.getpid()
        self.write_lock = threading.RLock()
        hold_across_fork(self)
        atexit.register(_flush_at_exit, weakref.ref(self))
        self.lease = Lease(_writer_of(weakref.ref(self)), enabled=budget.max_bytes is None)
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._writer: IndexWriter | None = None
        self._touched: dict[str, float] = {}
        self._last_flush = time.time()
        #: How many times this process found the index file replaced (damaged and set aside, here or by another
        #: process): every thread's connection is renewed once it differs from the one it connected under.
        self.renewals = 0
        self._renewing = threading.Lock()
        self._file_id: tuple[int, int] | None = None  # the index file connected to: (device, inode)

    def __repr__(self) -> str:
        return f"<Index {self.layout.index}>"

    def db(self) -> sqlite3.Connection:
        """This thread's connection (a new one once the index file was replaced)."""
        db = getattr(self._local, "db", None)
        if db is not None and self._local.renewals != self.renewals:
            close(db)
            db = None
        if db is None:
            db = self.connect()
            self._local.db, self._local.renewals = db, self.renewals
        return db

    def connect(self) -> sqlite3.Connection:
        """A new connection to the index file, its tables made if the file is new (one another process has
        just started in place of a damaged one)."""
        db = connect(self.layout.index)
        try:
            if not has_schema(db):
                create(db)
            self._file_id = _file_id(self.layout.index)
        except BaseException:
            close(db)
            raise
        return db

    def notice_replaced(self) -> None:
        """Renew every thread's connection if another process set the index file aside since this one
        connected (the file at its path is another, or none): the writer asks before each batch."""
        if self._file_id is not None and _file_id(self.layout.index) != self._file_id:
            with self._renewing:
                self._file_id = None
                self.renewals += 1

    def close_connection(self) -> None:
        """Close this thread's connection (before the index file is set aside)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            close(db)
            self._local.db = None

    def renew(self, error: sqlite3.DatabaseError) -> None:
        """The index said ``error``: if it says the file is damaged, set the file aside (once, whichever process
        finds it first, with one warning) and have every thread of this process connect to the new one;
        any other error is raised. What the old index named is then removed as orphans by the cache's
        recovery (see :attr:`renewals`) and downloaded again when read."""
        if not damaged(error):
            raise error
        with self._renewing:
            self.close_connection()
            set_aside(self.layout, error)
            self.renewals += 1

    def renewed(self, call: Callable[[], T]) -> T:
        """``call()``; if the index file turns out damaged, once more on a new one (:meth:`renew`)."""
        try:
            return call()
        except sqlite3.DatabaseError as e:
            self.renew(e)
        try:
            return call()
        except sqlite3.DatabaseError as e:
            if not damaged(e):
                raise
            raise CacheFolderError(errno.EIO, f"the cache's index {self.layout.index} was damaged again as soon as a "
                                              f"new one was started ({e}): the disk under it is failing; use a cache "
                                              "folder on another disk") from None

    @contextlib.contextmanager
    def write(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction (on this thread's connection unless one is given)."""
        db = db or self.db()
        with self.write_lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled it back itself (a damaged page)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @property
    def writer(self) -> IndexWriter:
        """The writer thread, started on first use (and again if it stopped)."""
        if self._writer is None or not self._writer.alive:
            with self._mutex:
                if self._writer is None or not self._writer.alive:
                    self._writer = IndexWriter(self)
                    # A multiprocessing child runs these, not atexit; registered here, not at a fork, which
                    # is before the child clears the ones it inherited.
                    multiprocessing.util.Finalize(None, _flush_at_exit, (weakref.ref(self),), exitpriority=10)
        return self._writer

    # -- uses, for LRU -------------------------------------------------------------------------

    def used(self, key: str) -> None:
        """Note a use for LRU; sent to the writer in batches, not on every hit."""
        now = time.time()
        self._touched[key] = now
        if len(self._touched) >= FLUSH_EVERY or now - self._last_flush > FLUSH_S:
            with self._mutex:
                touched, self._touched = self._touched, {}
                self._last_flush = now
            self.writer.touch(touched)

    def rank_now(self, ranks: dict[str, float]) -> None:
        """Send these LRU times to the writer now, after the uses noted before them (the order they happened)."""
        with self._mutex:
            self._touched.update(ranks)
            touched, self._touched = self._touched, {}
            self._last_flush = time.time()
        self.writer.touch(touched)

    def flush(self) -> None:
        """Wait until every pending index write of this process is applied."""
        with self._mutex:
            touched, self._touched = self._touched, {}
        if touched:
            self.writer.touch(touched)
        if self._writer is not None or touched:
            self.writer.flush()

    def forget_uses(self) -> None:
        with self._mutex:
            self._touched.clear()

    # -- reads and small writes ----------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """(entries, bytes), counting fills in progress (once this process's are recorded), not leases."""
        self.flush()
        return self.renewed(lambda: entries.usage(self.db()))

    def rows(self) -> list[dict]:
        """Every entry (not leases), most recently used first."""
        self.flush()
        return self.renewed(lambda: entries.rows(self.db()))

    def stored_crc(self, key: str, wait: bool = True) -> str | None:
        """The CRC32C computed when ``key`` was filled: one query, and (``wait``) a wait for this process's pending
        writes when its row is not marked ready yet (it was filled a moment ago)."""
        for pending in (False, True) if wait else (False,):
            if pending:
                self.flush()
            crc = self.renewed(lambda: entries.stored_crc(self.db(), key))
            if crc:
                return crc
        return None

    def discard(self, key: str) -> None:
        """Drop an entry and its file (the file once the row's deletion committed). This process's pending writes
        go first: a fill on the lease not recorded yet would otherwise name the removed file, and keep its fill
        lock meanwhile."""
        self.flush()
        self.renewed(lambda: self._discard(key))

    def _discard(self, key: str) -> None:
        doomed: list[tuple[str, int]] = []
        try:
            with self.write() as db:
                entries.delete(db, key)
                doomed.append((self.layout.object_path(key), -1))
        except BaseException:
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)

    def prune(self, limit: int) -> int:
        """Evict LRU entries no reader holds until at most ``limit`` bytes are cached; how many went."""
        self.flush()
        return self.renewed(lambda: self._prune(limit))

    def _prune(self, limit: int) -> int:
        doomed: list[tuple[str, int]] = []
        try:
            with self.write() as db:
                evicted = self.budget.prune(db, limit, doomed)
        except BaseException:
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)
        return evicted


class IndexWriter:
    """One thread per process applies index writes in batches ("group commit").

    Under a pool of staging threads, a write per fill serialises every fill behind the GIL: each
    sqlite call releases it, and taking it back can wait a whole switch interval. Here a batch
    of any size costs a handful of sqlite calls. Reservations wait for their answer; finished
    fills and LRU times are fire-and-forget (a batch with a placed fill or a use, and no request anyone waits for
    nor fill marked ready, waits up to ``GATHER_S`` for more to share its ``syncfs`` and its transaction, their
    fill locks held meanwhile), and each queued write holds its :class:`Index`, so a cache dropped (``stage(source,
    Cache(...))``) or a process exiting meanwhile still applies them (a crash before they are written leaves rows
    that recovery completes at the next open).
    """

    def __init__(self, index: Index) -> None:
        self._index_ref = weakref.ref(index)  # the thread must not keep its index alive
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._later: list[Queued] = []  # finished fills and cancellations a full disk refused: tried with the next batch
        self._outbox: list[Queued] = []  # writes of the download loop's current turn
        self._gate = threading.Lock()
        self._hurry = threading.Event()  # set by an item someone waits for (or a stop, or a fill marked ready)
        self._stopped = False  # set (under the gate) as the thread ends: later requests fail at once
        self._lease = (index.lease.key, index.lease.pid)  # deleted here if the index goes first
        self._db: sqlite3.Connection | None = None  # this thread's own
        self._db_renewals = 0
        self._thread = threading.Thread(target=self._run, name="dataferry-index", daemon=True)
        self._thread.start()

    def ask(self, request: Reserve | Forget, answer: Answer) -> None:
        """A request whose ``answer`` the caller waits for, as it waits (a thread on a ``Future``, the
        download loop on an ``asyncio.Future``: the answers of one batch come back to a loop in one
        hand-over; None: no one waits). A writer that has stopped fails it at once."""
        if not isinstance(request, (Reserve, Forget)):
            raise TypeError(f"not a request to ask the index writer: {request!r}")
        self._put(request, answer)

    def ready(self, crc: str, when: float, key: str) -> None:
        self._put(Ready(crc, when, key))

    def placed(self, row: Row, lease: str, path: str, release: Callable[[], None]) -> None:
        """A fill on ``lease``'s room, renamed into place but not yet durable (:class:`Placed`). Its fill lock is
        held until its row is written, so that no recovery takes the file, which has no row yet, for an
        orphan. A fill that cannot be recorded (the disk failed its ``syncfs``, the writer stopped) is removed,
        its room given back to the lease."""
        self._put(Placed(row, lease, path, release))

    def touch(self, touched: dict[str, float]) -> None:
        self._put(Touch(touched))

    def flush(self) -> None:
        fut: Future = Future()
        self._put(Flush(), fut)
        self._wait(fut)

    def _put(self, request: Request, answer: Answer = None) -> None:
        """Queue a write with a strong reference to its cache: the cache lives until it is applied.
        On the download loop, the writes of one turn of the loop go as one item (one wake-up of
        this thread, not one per fill)."""
        item = Queued(request, answer, self._index_ref())
        if threading.current_thread().name != "dataferry-aio":
            self._enqueue(item)
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._send_outbox)
        self._outbox.append(item)

    def _send_outbox(self) -> None:
        items, self._outbox = self._outbox, []
        self._enqueue(Queued(Many(items), None, None))

    def _enqueue(self, item: Queued) -> None:
        with self._gate:
            if not self._stopped:
                self._queue.put(item)
                if not _unhurried(_flat([item]), something_to_gather=False):
                    self._hurry.set()
                return
        _settle(_flat([item]), _stopped_error())
        _give_up_placed(_flat([item]))

    def _stop_taking(self) -> None:
        """As the thread ends: fail what is queued and everything asked from now on."""
        with self._gate:
            self._stopped = True
        left = []
        with contextlib.suppress(queue.Empty):
            while True:
                left.append(self._queue.get_nowait())
        _settle(_flat(left) + self._later, _stopped_error())
        _give_up_placed(_flat(left) + self._later)

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
        while True:
            try:
                batch = [self._queue.get(timeout=IDLE_CHECK_S)]
                self._hurry.clear()  # what set it is in this batch (put before set, cleared before the drain)
            except queue.Empty:
                if self._later:  # what a full disk refused, tried again while nothing else comes
                    batch = []
                else:
                    index = self._index_ref()
                    if index is None:  # the index is gone and nothing is queued: so is this thread, and its lease
                        self._drop_lease()
                        self._close()
                        return
                    if index.lease.let_go_if_idle():
                        self._connection(index)
                        self._drop_lease()
                    del index
                    continue
            batch += self._drained(4096 - len(batch))
            if _unhurried(_flat(batch)):
                batch += self._gathered(GATHER_S, 4096 - len(batch))
            batch, self._later = self._later + _flat(batch), []
            stop = any(isinstance(item.request, Stop) for item in batch)
            index = self._index_ref()  # alive: every queued item holds it
            try:
                if index is not None:
                    index.notice_replaced()
                self._commit(index, [item for item in batch if not isinstance(item.request, Stop)])
            finally:
                del index, batch
            if stop:  # the thread ends after this batch
                self._close()
                return

    def _drained(self, most: int) -> list[Queued]:
        """What is queued now, up to ``most`` items."""
        items: list[Queued] = []
        with contextlib.suppress(queue.Empty):
            while len(items) < most:
                items.append(self._queue.get_nowait())
        return items

    def _gathered(self, seconds: float, most: int) -> list[Queued]:
        """What comes within ``seconds`` (up to ``most`` items), ending early at the first that someone waits for.
        Only such an item wakes this thread meanwhile (:attr:`_hurry`): a wake-up per placed fill made the filling
        thread wait for the GIL at each, and doubled the CPU of a small file's fill (epoch 1 from a folder)."""
        self._hurry.wait(seconds)
        self._hurry.clear()  # put before set, cleared before the drain: an item that sets it again is taken next
        return self._drained(most)

    def _connection(self, index: Index) -> sqlite3.Connection:
        """This thread's connection, renewed when the index file was replaced."""
        if self._db is None or self._db_renewals != index.renewals:
            self._close()
            self._db_renewals = index.renewals
            self._db = index.connect()
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            close(self._db)
            self._db = None

    def _drop_lease(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # a row left behind is reclaimed once this process ends
            if self._db is not None:
                entries.drop_lease(self._db, *self._lease)

    def _commit(self, index: Index | None, batch: list[Queued], renewed: bool = False) -> None:
        """Apply a batch in one transaction; if it fails, item by item, so that one bad request
        fails alone and every other finished fill is still marked ready. A damaged index file is set
        aside and the batch applied to the new one (:meth:`Index.renew`)."""
        try:
            if index is None:
                raise RuntimeError("the cache was closed")
            self._answer(self._transaction(index, self._connection(index), batch))
            return
        except BaseException as e:  # noqa: BLE001 - retried one by one below
            error: BaseException = e
            if index is not None and not renewed and isinstance(e, sqlite3.DatabaseError) and damaged(e):
                try:
                    index.renew(e)
                except BaseException as still:  # noqa: BLE001 - failed as the batch did
                    error = still
                else:
                    self._commit(index, batch, renewed=True)
                    return
            if len(batch) == 1 or index is None:
                if isinstance(batch[0].request, (Ready, Forget, Placed)) and disk_full(error):
                    self._later += [Queued(item.request, None, item.owner) for item in batch]  # room by the next batch?
                else:
                    _give_up_placed(batch)
                _settle(batch, error)
                return
        for item in batch:
            self._commit(index, [item], renewed)

    def _transaction(self, index: Index, db: sqlite3.Connection, batch: list[Queued]) -> list[tuple[Any, Any]]:
        doomed: list[tuple[str, int]] = []
        placed = [item for item in batch if isinstance(item.request, Placed)]
        if placed:
            try:
                syncfs(index.layout.objects)  # the placed files' bytes are on disk before any row names them
            except OSError:  # not known to be on disk: never named by a row (not retried: a later syncfs may not see the error)
                _give_up_placed(placed)
                batch = [item for item in batch if not isinstance(item.request, Placed)]
        try:
            with index.write(db):
                answers = self._apply(index, db, batch, doomed)
        except BaseException:
            release(doomed, unlink=False)
            raise
        release(doomed, unlink=True)  # files go only once the rows naming them are gone for good
        _release_placed(batch)
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
    def _apply(index: Index, db: sqlite3.Connection, batch: list[Queued], doomed: list) -> list[tuple[Any, Any]]:
        requests = [item.request for item in batch]
        touched: dict[str, float] = {}
        for request in requests:
            if isinstance(request, Touch):
                touched.update(request.touched)
        # Finished fills and recent uses first, so the LRU order the reservations see is current.
        entries.mark_ready(db, [r for r in requests if isinstance(r, Ready)])
        entries.record_placed(db, [r for r in requests if isinstance(r, Placed)])
        entries.touch(db, touched)
        entries.forget(db, [r for r in requests if isinstance(r, Forget)])
        answers: list[tuple[Any, Any]] = [(item.answer, None) for item in batch
                                          if isinstance(item.request, (Flush, Forget)) and item.answer is not None]
        wants = [(item.request.row, item.answer) for item in batch if isinstance(item.request, Reserve)]
        return answers + (index.budget.decide(db, wants, doomed) if wants else [])


def _file_id(path: Any) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _unhurried(items: list[Queued], something_to_gather: bool = True) -> bool:
    """Whether a batch may wait for more: no one waits for an answer, no stop, no fill marked ready (its lock is
    let go already: another process may be waiting for its row to check a copy against), and
    (``something_to_gather``) a placed fill (whose ``syncfs`` the batch would pay for) or a use (a DataLoader worker
    under a budget demotes each sample it reads: a transaction each cost its reads about 100 us a sample)."""
    if any(item.answer is not None or isinstance(item.request, (Stop, Ready)) for item in items):
        return False
    return not something_to_gather or any(isinstance(item.request, (Placed, Touch)) for item in items)


def _flat(items: list[Queued]) -> list[Queued]:
    return [one for item in items for one in (item.request.items if isinstance(item.request, Many) else (item,))]


def _release_placed(items: list[Queued], recorded: bool = True) -> None:
    """Placed fills, recorded or not: let go of their fill locks and tell their leases. One that cannot be
    recorded loses its file first, while its lock is still held (no row names it, and it may not be
    durable), and its room goes back to the lease."""
    for item in items:
        placed, owner = item.request, item.owner
        if not isinstance(placed, Placed):
            continue
        if not recorded:
            with contextlib.suppress(OSError):
                os.unlink(placed.path)
        with contextlib.suppress(OSError):
            placed.release()
        if owner is not None and placed.lease == owner.lease.key:
            (owner.lease.recorded if recorded else owner.lease.give_back)(placed.row.size)


def _give_up_placed(items: list[Queued]) -> None:
    _release_placed(items, recorded=False)


def _stopped_error() -> RuntimeError:
    return RuntimeError("the cache's index writer thread stopped before answering; try again (a new one starts)")


def _settle(items: list[Queued], error: BaseException) -> None:
    """Fail the futures of ``items`` (queued requests) with ``error``."""
    on_loops: dict[asyncio.AbstractEventLoop, list] = {}
    for _, fut, _ in items:
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
