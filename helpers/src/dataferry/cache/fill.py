"""Filling: one object from its source into the cache, verified, crash-safe, within a deadline.

A fill downloads to ``tmp/`` while computing CRC32C, resumes after transient errors (the sources'
:func:`~dataferry.sources.retry_policy`), checks size and checksum, fsyncs and renames into
``objects/``: a file there is always whole. The whole fill is bounded by ``retry_deadline_s`` (or a
second per MB, if longer), each wait for bytes by ``STALL_S``; errors of the cache's own disk are
never retried as if the network had failed, and a disk that fills up makes the read stream instead.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import io
import os
import sqlite3
import time
import warnings
from typing import BinaryIO

import google_crc32c
from google.api_core.exceptions import RetryError

from dataferry import aio
from dataferry.cache.checksum import b64
from dataferry.cache.errors import CacheFolderError, CacheFullWarning, DamagedAtSource, FillTimeout
from dataferry.cache.layout import printable
from dataferry.sources import Attempts, Entry, Source, SourceError, fetches_async, is_transient, retry_policy, where

__all__ = ["Filling", "Hashing", "disk_full", "STALL_S"]

STALL_S = 30.0  # the longest wait for the next byte of a download before it is retried
MIN_FILL_BYTES_PER_S = 1e6  # a fill may take retry_deadline_s, or a second per MB if that is longer


class Hashing:
    """Writes through to ``out`` while computing CRC32C and counting bytes; past ``deadline``
    (a ``time.monotonic()`` value) it refuses more, so a trickling link cannot outlast the deadline."""

    def __init__(self, out: BinaryIO, deadline: float = float("inf")) -> None:
        self.out, self.n, self.crc, self.deadline = out, 0, google_crc32c.Checksum(), deadline

    def write(self, data: bytes) -> int:
        if time.monotonic() > self.deadline:
            raise FillTimeout(f"the deadline passed with {self.n} bytes received")
        try:
            self.out.write(data)
        except OSError as e:
            raise CacheFolderError.writing(e) from e
        self.crc.update(data)
        self.n += len(data)
        return len(data)

    def restart(self) -> None:
        self.out.seek(0)
        self.out.truncate()
        self.n, self.crc = 0, google_crc32c.Checksum()


@functools.lru_cache(maxsize=64)
def _fetch_takes_timeout(cls: type) -> bool:
    return "timeout" in inspect.signature(cls.fetch).parameters


def takes_timeout(source: Source) -> bool:
    return _fetch_takes_timeout(type(source))


def disk_full(exc: BaseException) -> bool:
    """The cache's disk (or its index) ran out of space."""
    if isinstance(exc, sqlite3.OperationalError):
        return "full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def source_blip(exc: BaseException) -> bool:
    """Worth retrying: a transient error of the source, never one of the cache's own disk, nor a deadline."""
    return not isinstance(exc, (CacheFolderError, FillTimeout)) and is_transient(exc)


def damage(entry: Entry, n: int, crc: str) -> str:
    """What is wrong with ``n`` bytes of checksum ``crc`` as a copy of ``entry`` ("" if nothing)."""
    if n != entry.size:
        return f"got {n} bytes, expected {entry.size}"
    if entry.crc32c and crc != entry.crc32c:
        return f"crc32c {crc}, expected {entry.crc32c}"
    return ""


def damaged(name: str, why: str, downloads: int) -> DamagedAtSource:
    return DamagedAtSource(f"{name}: {why} after {downloads} downloads; the object or the connection is damaged. "
                         "Nothing was cached.")


def gave_up(name: str, attempts: Attempts, e: RetryError | FillTimeout) -> SourceError:
    """The error of a download that kept failing (the retry deadline) or did not finish in time."""
    if isinstance(e, RetryError):
        return SourceError(f"{attempts.gave_up(f'{name}: the source', e.cause)}; nothing was cached.")
    return SourceError(f"{attempts.gave_up(f'{name}: the download did not finish', e, 'within')}; nothing was cached.")


class Filling:
    """The :class:`~dataferry.cache.Cache` methods that fill it."""

    def fill(self, source: Source, item: Entry | str) -> int:
        """Make sure the object is cached. Returns the bytes downloaded (0 if it was already
        there, -1 if it cannot fit in the budget). One download per object per machine: other
        threads and processes asking for it at the same time wait for this one."""
        return self._fill(source, item)

    def _fill(self, source: Source, item: Entry | str, ahead: bool = False) -> int:
        """:meth:`fill`. A fill ``ahead`` of a reader that waited for someone else's fill of the same
        object does nothing after it, as on the download loop: that fill was for its own read."""
        entry = self._entry(source, item)
        key = self.key(source, entry)
        path = self._object_path(key)
        if os.path.exists(path):
            return 0
        t0 = time.perf_counter()
        with self._fill_lock(key) as waited:
            self._count(wait_s=time.perf_counter() - t0)
            if os.path.exists(path) or (ahead and waited):
                return 0
            self._count(misses=1)
            refusal = self._reserve(source, entry, key)
            if refusal is not None:
                self._local.refusal = refusal.why
                return -1
            try:
                return self._download_into_place(source, entry, key, path)
            except BaseException as e:
                self._cancel_fill(key)
                if not disk_full(e):
                    raise
                self._local.refusal = f"the cache's disk filled up during the download ({self._free()})"
                return -1

    @property
    def last_refusal(self) -> str:
        """Why this thread's last fill found no room (the reason a read streamed, or a stage skipped)."""
        return getattr(self._local, "refusal", "")

    def _cancel_fill(self, key: str) -> None:
        """Drop a failed fill's reservation; on a full disk the index may refuse even that, and the
        row waits for the next batch of index writes (or the next open) to go."""
        try:
            with self._write() as db:
                db.execute("DELETE FROM entries WHERE key = ? AND state = 'filling'", (key,))
        except sqlite3.OperationalError as e:
            if not disk_full(e):
                raise
            self._index.forget(key)

    def _download_into_place(self, source: Source, entry: Entry, key: str, path: str) -> int:
        """Download to a temp file, verify, fsync, rename into place. The rename is atomic, so
        ``objects/`` only ever holds whole, verified files. (The folder is not fsynced: after a
        power cut a just-renamed file may be missing, never partial; it is fetched again.)"""
        tmp = f"{self._tmp}/{key}.{os.getpid()}.part"
        t0 = time.perf_counter()
        try:
            with open(tmp, "wb") as f:
                if fetches_async(source):  # on the download loop, a large object in ranges
                    crc = aio.run(self._download_async(source, entry, f.fileno()))
                else:
                    crc = self._download(source, entry, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._index.ready(crc, time.time(), key)
        self._local.filled = (key, crc)  # what this thread's verified read checks the copy against, index or not
        self._count(bytes_from_source=entry.size, fetch_s=time.perf_counter() - t0)
        return entry.size

    def _download(self, source: Source, entry: Entry, out: BinaryIO) -> str:
        """Copy the object into ``out`` with retries (resuming) and checks; returns its CRC32C.
        The whole fill is bounded by ``retry_deadline_s`` (or a second per MB, if that is longer)."""
        limit = max(self.retry_deadline_s, entry.size / MIN_FILL_BYTES_PER_S)
        writer = Hashing(out, time.monotonic() + limit)
        for attempt in range(self.max_refetches + 1):
            if attempt:
                writer.restart()
                self._count(refetches=1)
            self._copy_with_retries(source, entry, writer, limit)
            got = b64(writer.crc)
            why = damage(entry, writer.n, got)
            if not why:
                return got
        raise damaged(where(source, printable(entry.name)), why, self.max_refetches + 1)

    def _copy_with_retries(self, source: Source, entry: Entry, writer: Hashing, limit: float) -> None:
        attempts = Attempts()

        def on_error(exc: BaseException) -> None:
            attempts(exc)
            self._count(retries=1)

        def attempt() -> None:
            left = writer.deadline - time.monotonic()
            if left <= 0:
                raise FillTimeout(f"the deadline passed with {writer.n} bytes received")
            if writer.n < entry.size or entry.size == 0:
                if takes_timeout(source):
                    source.fetch(entry, writer, start=writer.n, timeout=min(STALL_S, left))
                else:  # a Source written before fetch() took a timeout: the writer still keeps the deadline
                    source.fetch(entry, writer, start=writer.n)

        try:
            retry_policy(limit, on_error, predicate=source_blip)(attempt)()
        except (RetryError, FillTimeout) as e:
            raise gave_up(where(source, printable(entry.name)), attempts, e) from (e.cause if isinstance(e, RetryError) else e)

    def _stream(self, source: Source, entry: Entry) -> bytes:
        warnings.warn(f"{where(source, printable(entry.name))} ({entry.size / 1e6:.1f} MB) does not fit in the cache "
                      f"{self}: {self.last_refusal}; reading it straight from the source", CacheFullWarning,
                      stacklevel=3)
        buf = io.BytesIO()
        self._download(source, entry, buf)
        self._count(streamed=1, bytes_from_source=entry.size)
        return buf.getvalue()
