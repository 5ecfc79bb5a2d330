"""Locks: one download per object per machine, and per-process state that survives a fork.

A fill lock is a one-byte open-file-description lock (``F_OFD_SETLK``) on one shared file,
``locks/fill.lock``, at an offset taken from the object's key: no lock file to create or open
per fill (creating 4,096 stripe files cost a cold stage of small objects more than its
downloads, issue 10), no false sharing between objects, and, as with ``flock``, a waiter sleeps
in the kernel and wakes the moment the holder is done, and the kernel drops a lock when its holder
dies, so a crash never wedges the others. Locks of one open file description never exclude each
other, so each thread has its own; coroutines on the download loop share one thread and exclude
each other in memory. Readers hold a shared ``flock`` on the object they read, so eviction (which
takes it exclusively, without waiting) never removes an entry in use. After a fork, every live
cache in the child gets fresh locks, connections and counters at once (``os.register_at_fork``, as
fsspec does): a lock some parent thread held at the fork would otherwise stay held in the child.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FillLocks", "renew_after_fork", "hold_across_fork", "lock_offset"]

_LIVE: weakref.WeakSet = weakref.WeakSet()
_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # Linux's numbers, where Python does not name them
_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)


def lock_offset(key: str) -> int:
    """The byte of ``locks/fill.lock`` that stands for ``key`` (60 bits of its hash; any other
    name, e.g. a stray file's, is hashed first)."""
    try:
        return int(key[:15], 16)
    except ValueError:
        return int(hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:15], 16)


def _request(kind: int, offset: int) -> bytes:
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)  # struct flock, l_pid 0 as OFD locks need


class FillLocks:
    """The fill locks of one cache folder, for this process: one open file description per thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _file(self) -> Any:
        f = getattr(self._local, "file", None)
        if f is None:
            f = self._local.file = open(self.path, "a+b", buffering=0)  # closed with its thread's locals
        return f.fileno()

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[bool]:
        """Hold ``key``'s fill lock, waiting for it (in the kernel) while another thread or process
        does. Gives whether it had to wait for another. Let go of at the end, unless :meth:`keep` says."""
        waited = not self.try_hold(key)
        if waited:
            fcntl.fcntl(self._file(), _SETLKW, _request(fcntl.F_WRLCK, lock_offset(key)))
        try:
            yield waited
        finally:
            kept = getattr(self._local, "kept", None)
            if kept == key:
                self._local.kept = None
            else:
                self.release(key)

    def unlocker(self, key: str) -> Callable[[], None]:
        """A call that lets go of ``key``'s fill lock, which this thread holds, from any thread (it keeps
        this thread's lock file open until then)."""
        return functools.partial(_unlock, self._local.file, lock_offset(key))

    def keep(self, key: str) -> None:
        """Keep ``key``'s fill lock past the end of this thread's :meth:`hold` (its :meth:`unlocker` lets go)."""
        self._local.kept = key

    def try_hold(self, key: str) -> bool:
        """Take ``key``'s fill lock if no other thread or process holds it; never waits."""
        try:
            fcntl.fcntl(self._file(), _SETLK, _request(fcntl.F_WRLCK, lock_offset(key)))
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def release(self, key: str) -> None:
        fcntl.fcntl(self._file(), _SETLK, _request(fcntl.F_UNLCK, lock_offset(key)))


def _unlock(file: Any, offset: int) -> None:
    fcntl.fcntl(file.fileno(), _SETLK, _request(fcntl.F_UNLCK, offset))


def renew_after_fork(obj: Any) -> None:
    """While ``obj`` lives, a forked child calls ``obj._init_process_state()`` at once for fresh locks,
    connections and counters."""
    _LIVE.add(obj)


def hold_across_fork(obj: Any, last: bool = False) -> None:
    """While ``obj`` lives, its write lock ``obj.write_lock`` is held while the process forks, so no index
    transaction is half-done in the child's copy of SQLite's lock bookkeeping (a child would wait on a
    lock no thread of its own will ever release). An index lives as long as writes are queued for it,
    so this holds even for a cache dropped meanwhile. ``last``: taken after every other (a lock held for
    a moment, never while waiting for another)."""
    (_LAST if last else _GUARDED).add(obj)


_GUARDED: weakref.WeakSet = weakref.WeakSet()
_LAST: weakref.WeakSet = weakref.WeakSet()
_HELD: dict[int, list[Any]] = {}  # by forking thread: two threads may fork at once


def _before_fork() -> None:
    held = _HELD.setdefault(threading.get_ident(), [])
    for obj in [*sorted(_GUARDED, key=id), *sorted(_LAST, key=id)]:  # one order everywhere: no deadlock
        obj.write_lock.acquire()
        held.append(obj)


def _release_held() -> None:
    held = _HELD.pop(threading.get_ident(), [])
    while held:
        with contextlib.suppress(RuntimeError):
            held.pop().write_lock.release()


def _after_fork_in_parent() -> None:
    _release_held()


def _after_fork_in_child() -> None:
    _release_held()  # the child's one thread is the one that took them
    _HELD.clear()
    for obj in list(_LIVE):
        obj._init_process_state()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
