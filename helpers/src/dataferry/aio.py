"""One event loop per process, on a thread of its own, for downloads in flight by the hundred.

A pool of threads each running one download spends more of two cores handing the GIL over than
downloading (issue 10's profile: 735k futex calls for 2,000 small objects); coroutines on one loop
need no hand-over. Callers on other threads submit coroutines and wait on ordinary futures. A
forked child starts a loop of its own the first time it needs one (``os.register_at_fork``, as
fsspec does), since the parent's loop thread does not exist there. This module imports no other
dataferry module.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from dataferry.errors import interrupted_at_exit

__all__ = ["loop", "submit", "run", "at_close"]

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_closers: list[Callable[[], Coroutine[Any, Any, None]]] = []
_CANCEL_WAIT_S = 5.0


def loop() -> asyncio.AbstractEventLoop:
    """This process's download loop, started on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="dataferry-aio", daemon=True)
            _thread.start()
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the loop; its result or error arrives in the returned future."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the loop and wait for it (never from the loop's own thread). A caller interrupted
    while it waits (Ctrl-C) cancels ``coro`` and waits a moment for it to end, so nothing it was writing
    into (a file the caller then removes) is still written to from the loop."""
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("dataferry.aio.run() called from the loop it would wait on")
    started, ended = threading.Event(), threading.Event()

    async def guarded() -> T:
        started.set()
        try:
            return await coro
        finally:
            ended.set()

    fut = submit(guarded())
    try:
        return fut.result()
    except BaseException:
        fut.cancel()  # cancels the task on the loop
        if started.is_set():
            ended.wait(_CANCEL_WAIT_S)
        raise


def at_close(closer: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``closer()`` on the loop when the process exits (e.g. to close an HTTP session)."""
    _closers.append(closer)


@atexit.register
def _close() -> None:
    if _loop is None or _thread is None or not _thread.is_alive():
        return

    async def close_all() -> None:
        for closer in _closers:
            try:
                await closer()
            except Exception:  # noqa: BLE001, S110 - exiting anyway; a session that fails to close is harmless
                pass

    try:
        asyncio.run_coroutine_threadsafe(close_all(), _loop).result(timeout=5)
    except KeyboardInterrupt:
        interrupted_at_exit("closing its connections")
    except Exception:  # noqa: BLE001, S110 - never hang or fail an exiting process
        pass


_parents: list[Any] = []


def _forget_after_fork() -> None:
    """The parent's loop is kept, never used or closed, in the child: closing it there would
    change the epoll set the child shares with the parent."""
    global _loop, _thread, _lock
    _parents.append(_loop)
    _loop, _thread, _lock = None, None, threading.Lock()
    _closers.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
