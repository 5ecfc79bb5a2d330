"""How a fill's bytes travel: one transport per kind of source, with the sources' one retry policy.

- :func:`fetch_ranges`, for a source with ``fetch_async`` (a bucket, over aiohttp), on the download
  loop: an object of ``RANGE_MIN`` bytes or more comes in ``PART``-sized byte ranges, ``RANGES`` at once,
  each resumed on its own after a blip, the parts' CRC32C combined; a read that streams past the budget
  travels the same way.
- :func:`fetch_whole`, for any other source (a folder: local disk, Drive, a gcsfuse mount): one call
  of ``source.fetch``, resumed from the bytes it has after a blip.

Both keep the fill's deadline however slowly bytes trickle in, write into a :class:`Sink` (a temp file,
or bytes held in memory), and never retry an error of the cache's own disk as if the network had failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import google_crc32c
from google.api_core.exceptions import RetryError

from dataferry.cache.checksum import combine, value
from dataferry.cache.errors import CacheFolderError, FillTimeout
from dataferry.cache.layout import printable
from dataferry.sources import Attempts, Entry, Source, SourceError, is_transient, retry_policy, retry_policy_async, where
from dataferry.sources.retries import BACKOFF

__all__ = ["Sink", "Part", "write_new", "fetch_whole", "fetch_ranges", "source_blip", "RANGE_MIN", "PART", "RANGES", "STALL_S"]

STALL_S = 30.0  # the longest wait for the next byte of a download before it is retried
RANGE_MIN = 32 << 20  # objects this large come in ranges
PART = 16 << 20
RANGES = 16  # ranges of one object in flight at once
WRITEBACK = 8 << 20  # a range written to a file starts the disk on every this many bytes (see Part.write)
ZERO_TAIL = 64 << 10  # a copy's trailing zeros, this many or more, are left a hole (see _written)
_ZEROS = bytes(ZERO_TAIL)
_PAGE = 4096

_libc = ctypes.CDLL(None, use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_SYNC_FILE_RANGE_WRITE = 2


class Sink:
    """Where one fill's bytes go: written in place into its temp file (``fd``), or held in memory
    (``held``, preallocated, each range written at its offset)."""

    def __init__(self, tmp: str, size: int, held: bool) -> None:
        self.tmp, self.size, self.fd = tmp, size, -1
        self.held = bytearray(size) if held else None
        if not held:
            try:
                self.fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(self.fd, size)  # sized once: a range's zeros left unwritten are a hole (see _written)
            except OSError as e:
                raise CacheFolderError.writing(e) from e

    def __repr__(self) -> str:
        return f"<Sink {'held' if self.held is not None else self.tmp}>"

    def write_out(self) -> None:
        """Held bytes into the temp file, made now (open, for an ``fsync``, until :meth:`close`)."""
        if self.held is None or self.fd >= 0:
            return
        try:
            self.fd = write_new(self.tmp, self.held)
        except OSError as e:
            raise CacheFolderError.writing(e) from e

    def restart(self) -> None:
        """Before a refetch: the bytes so far go (what is held keeps its size, each byte written again)."""
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, self.size)
        if self.held is not None:
            del self.held[self.size:]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def drop(self) -> None:
        """A failed fill: close and remove the temp file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def write_new(path: str, data: bytes | bytearray) -> int:
    """``path`` created (or emptied) holding ``data``; its descriptor, still open (closed if the writing fails).
    A trailing run of zeros is left a hole (:func:`_written`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        end = _written(data)
        view = memoryview(data)[:end]
        while view:
            view = view[os.write(fd, view):]
        if end < len(data):
            os.ftruncate(fd, len(data))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _written(data: bytes | bytearray | memoryview) -> int:
    """How many of ``data``'s first bytes to write: all but a trailing run of at least ``ZERO_TAIL`` zeros (to a
    page), over which the file is sized instead: a hole, read back as zeros with no disk. Decode-once's records are all
    the size of the largest picture, the rest zeros (a flower's is 262 KB of pixels in 393 KB): a process's first read
    of a copy reads it whole to check it, and the kernel's readahead reads past the picture. Compared a block at a
    time as bytes (a memoryview compares byte by byte, 60x slower)."""
    view = memoryview(data).cast("B")
    n = len(view)
    if n < ZERO_TAIL or view[-1] != 0 or bytes(view[n - ZERO_TAIL:]) != _ZEROS:
        return n
    end = n - ZERO_TAIL
    while end >= ZERO_TAIL and bytes(view[end - ZERO_TAIL:end]) == _ZEROS:
        end -= ZERO_TAIL
    while end >= _PAGE and bytes(view[end - _PAGE:end]) == _ZEROS[:_PAGE]:
        end -= _PAGE
    return end


class Part:
    """One byte range of a fill (``start``..``end``), written at its offset with its own CRC32C and byte
    count; past ``deadline`` (a ``time.monotonic()`` value) it refuses more, so a trickling link cannot
    outlast the fill's deadline."""

    def __init__(self, sink: Sink, start: int, end: int, deadline: float) -> None:
        self.sink, self.start, self.end, self.deadline = sink, start, end, deadline
        self.n, self.crc = 0, google_crc32c.Checksum()
        self.started = 0  # bytes of this range whose writing back to disk has been started

    def write(self, data: bytes) -> int:
        if time.monotonic() > self.deadline:
            raise FillTimeout(f"the deadline passed with {self.n} bytes received")
        at = self.start + self.n
        if self.sink.held is not None:
            self.sink.held[at:at + len(data)] = data
        else:
            try:
                view = memoryview(data)[:_written(data)]
                while view:
                    written = os.pwrite(self.sink.fd, view, at)
                    view, at = view[written:], at + written
            except OSError as e:
                raise CacheFolderError.writing(e) from e
        self.crc.update(data)
        self.n += len(data)
        if self.sink.fd >= 0 and self.n - self.started >= WRITEBACK and _sync_file_range is not None:
            # Start writing these pages to disk now (it does not wait for them): the fill's flush at its end
            # then finds little left, rather than the whole object dirty in memory (~1.6 s for 512 MiB here).
            _sync_file_range(self.sink.fd, self.start + self.started, self.n - self.started, _SYNC_FILE_RANGE_WRITE)
            self.started = self.n
        return len(data)


def source_blip(exc: BaseException) -> bool:
    """Worth retrying: a transient error of the source, never one of the cache's own disk, nor a deadline."""
    return not isinstance(exc, (CacheFolderError, FillTimeout)) and is_transient(exc)


def gave_up(name: str, attempts: Attempts, e: RetryError | FillTimeout) -> SourceError:
    """The error of a download that kept failing (the retry deadline) or did not finish in time."""
    if isinstance(e, RetryError):
        return SourceError(f"{attempts.gave_up(f'{name}: the source', e.cause)}; nothing was cached.")
    return SourceError(f"{attempts.gave_up(f'{name}: the download did not finish', e, 'within')}; nothing was cached.")


@functools.lru_cache(maxsize=64)
def _fetch_takes_timeout(cls: Any) -> bool:
    return "timeout" in inspect.signature(cls.fetch).parameters


def fetch_whole(source: Source, entry: Entry, sink: Sink, deadline: float, count: Callable[..., None]) -> tuple[int, int]:
    """Every byte of ``entry`` in one part through ``source.fetch`` (a source without ``fetch_async``), resumed
    from the bytes it has after each blip; (bytes, CRC32C)."""
    part = Part(sink, 0, entry.size, deadline)
    attempts = Attempts()
    timed = _fetch_takes_timeout(type(source))

    def on_error(exc: BaseException) -> None:
        attempts(exc)
        count(retries=1)

    def attempt() -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FillTimeout(f"the deadline passed with {part.n} bytes received")
        if part.n < entry.size or entry.size == 0:
            if timed:
                source.fetch(entry, part, start=part.n, timeout=min(STALL_S, left))  # type: ignore[arg-type]
            else:  # a Source written before fetch() took a timeout: the part still keeps the deadline
                source.fetch(entry, part, start=part.n)  # type: ignore[arg-type]

    try:
        try:  # the first attempt before any retry policy is built (building one cost ~35 us a fill of a small file)
            attempt()
        except Exception as e:
            if not source_blip(e):
                raise
            on_error(e)
            time.sleep(min(BACKOFF["initial"], max(deadline - time.monotonic(), 0.0)))
            retry_policy(max(deadline - time.monotonic(), 0.0), on_error, predicate=source_blip)(attempt)()
    except (RetryError, FillTimeout) as e:
        raise gave_up(where(source, printable(entry.name)), attempts, e) from (
            e.cause if isinstance(e, RetryError) else e)
    return part.n, value(part.crc)


async def fetch_ranges(source: Any, entry: Entry, sink: Sink, deadline: float, count: Callable[..., None]) -> tuple[int, int]:
    """Every byte of ``entry`` through ``source.fetch_async`` on the download loop, in ranges for a large
    object (``RANGES`` at a time; the first to fail cancels the rest); (bytes, the parts' CRC32C combined)."""
    step = PART if entry.size >= RANGE_MIN else max(entry.size, 1)
    parts = [Part(sink, start, min(start + step, entry.size), deadline)
             for start in range(0, max(entry.size, 1), step)]
    if len(parts) == 1:
        await _range(source, entry, part=parts[0], count=count)
    else:
        gate = asyncio.Semaphore(RANGES)

        async def one(part: Part) -> None:
            async with gate:
                await _range(source, entry, part=part, count=count)

        tasks = [asyncio.ensure_future(one(part)) for part in parts]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    n, crc = parts[0].n, value(parts[0].crc)
    for part in parts[1:]:
        crc, n = combine(crc, value(part.crc), part.n), n + part.n
    return n, crc


async def _range(source: Any, entry: Entry, *, part: Part, count: Callable[..., None]) -> None:
    """One byte range, retried (resuming from the bytes it has) while the source blips. Most
    ranges need one attempt: the retry machinery is made only for those that do not."""
    attempts = Attempts()
    try:
        return await _attempt(source, entry, part)
    except FillTimeout as e:
        raise gave_up(where(source, printable(entry.name)), attempts, e) from e
    except Exception as e:  # noqa: BLE001 - a blip goes on to the retry policy, anything else is raised
        if not source_blip(e):
            raise
        first = e

    def on_error(exc: BaseException) -> None:
        attempts(exc)
        count(retries=1)

    on_error(first)
    try:
        if time.monotonic() >= part.deadline:
            raise RetryError("the deadline passed", first) from first
        await retry_policy_async(max(part.deadline - time.monotonic(), 0.0), on_error,
                                 predicate=source_blip)(_attempt)(source, entry, part)
    except (RetryError, FillTimeout) as e:
        raise gave_up(where(source, printable(entry.name)), attempts, e) from (
            e.cause if isinstance(e, RetryError) else e)


async def _attempt(source: Any, entry: Entry, part: Part) -> None:
    """One request for the bytes of ``part`` it does not have yet; the deadline holds however
    slowly bytes trickle in."""
    left = part.deadline - time.monotonic()
    if left <= 0:
        raise FillTimeout(f"the deadline passed with {part.n} bytes of a range received")
    want = part.end - part.start
    if part.n < want or want == 0:
        try:
            await source.fetch_async(entry, part, part.start + part.n, part.end, timeout=min(STALL_S, left),
                                     total=left + 0.5)
        except TimeoutError:
            if time.monotonic() < part.deadline:
                raise  # a stall, retried
            raise FillTimeout(f"the deadline passed with {part.n} bytes of a range received") from None
        if part.n < want:
            raise ConnectionError(f"the connection closed after {part.n} of {want} bytes")
