"""Locks: one download per object per machine, and per-process state that survives a fork.

Fill locks are plain blocking ``flock``\\s on 4096 striped files (filelock's polling and fork
bookkeeping serialise a pool of staging threads): a waiter sleeps in the kernel and wakes the moment
the holder is done, and the kernel drops a lock when its holder dies, so a crash never wedges the
others. Readers hold a shared ``flock`` on the object they read, so eviction (which takes it
exclusively, without waiting) never removes an entry in use. After a fork, every live cache in the
child gets fresh locks, connections and counters at once (``os.register_at_fork``, as fsspec does):
a lock some parent thread held at the fork would otherwise stay held in the child forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = ["fill_lock", "renew_after_fork", "LOCK_STRIPES_HEX"]

LOCK_STRIPES_HEX = 3  # 4096 fill-lock files
_LIVE: weakref.WeakSet = weakref.WeakSet()


@contextlib.contextmanager
def fill_lock(locks_dir: str, key: str) -> Iterator[None]:
    """The fill lock of ``key``'s stripe, across threads and processes."""
    fd = os.open(f"{locks_dir}/{key[:LOCK_STRIPES_HEX]}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def renew_after_fork(obj: Any) -> None:
    """Keep ``obj`` safe across ``fork()`` while it lives: its write lock ``obj._writer`` is held
    while the process forks, so no index transaction is half-done in the child's copy of SQLite's
    lock bookkeeping (a child would wait on a lock no thread of its own will ever release), and the
    child calls ``obj._init_process_state()`` at once for fresh locks, connections and counters."""
    _LIVE.add(obj)


_HELD: list[Any] = []


def _before_fork() -> None:
    for obj in sorted(_LIVE, key=id):  # one order everywhere: two forking threads cannot deadlock
        obj._writer.acquire()
        _HELD.append(obj)


def _after_fork_in_parent() -> None:
    while _HELD:
        _HELD.pop()._writer.release()


def _after_fork_in_child() -> None:
    _HELD.clear()
    for obj in list(_LIVE):
        obj._init_process_state()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
