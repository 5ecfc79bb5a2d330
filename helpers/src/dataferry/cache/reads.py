"""Reading a cached copy, checked: every read of :class:`~dataferry.Cache` (``read``, ``open``, ``path``, a read
again) is one of this part's, which fills a missing copy, checks the bytes against the CRC32C the source or the
fill vouches for, drops and fills again a copy that reads back wrong, and names a disk that keeps doing so."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import BinaryIO

import google_crc32c

from dataferry.cache.checksum import b64, stream_crc
from dataferry.cache.counters import Counters
from dataferry.cache.errors import CacheFolderError, CacheFullWarning, DamagedOnDisk
from dataferry.cache.fill import FillEngine
from dataferry.cache.index import Index
from dataferry.cache.layout import Layout, printable
from dataferry.cache.layout import key as entry_key
from dataferry.cache.locks import FillLocks
from dataferry.sources import Entry, Source, where

__all__ = ["Reads", "UNVOUCHED_READS"]

#: Reads of a copy that other processes evicted before it could be checked, before giving up: no disk fault.
UNVOUCHED_READS = 20


def _read_up_to(fd: int, limit: int) -> bytes:
    """The next ``limit`` bytes of a file, fewer at its end: one call up to 2 GiB, less a page."""
    parts = [os.read(fd, limit)]
    got = len(parts[0])
    while got < limit and (part := os.read(fd, limit - got)):
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_all(fd: int, size: int) -> bytes:
    """Read a whole file of expected ``size``, or one byte more: enough to tell it is not that size."""
    return _read_up_to(fd, size + 1)


_HERE = os.path.dirname(__file__)


def _callers_level() -> int:
    """The ``stacklevel`` at which a warning raised by the caller of this points at the first frame outside this
    package's cache (a read, an open and a path reach a warning through different depths)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _HERE:
        frame, level = frame.f_back, level + 1
    return level


class Reads:
    """The reads of one cache folder in this process, from its parts (made again with them after a fork);
    ``describe()`` names the cache in a warning."""

    def __init__(self, layout: Layout, index: Index, fills: FillEngine, counters: Counters, locks: FillLocks,
                 describe: Callable[[], str]) -> None:
        self._layout, self._index, self._fills, self._counters, self._locks = layout, index, fills, counters, locks
        self.root, self.max_refetches, self._describe = layout.root, fills.max_refetches, describe

    def again(self, key: str, size: int, crc32c: int, used_up: bool = False) -> bytes | None:
        """:meth:`Cache.reread <dataferry.Cache.reread>`: the first ``size`` bytes of ``key``'s copy, checked against
        ``crc32c``, what an earlier checked read learned of them; None when they are gone or read back otherwise."""
        try:
            fd = os.open(self._layout.object_path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size < size:  # never read more than the copy holds, whatever a record says
                return None
            data = _read_up_to(fd, size)
        finally:
            os.close(fd)
        if len(data) != size or google_crc32c.value(data) != crc32c:
            return None
        self._counters.add(hits=1, bytes_from_cache=size)
        if used_up:
            self._index.rank_now({key: -time.time()})
        else:
            self._index.used(key)
        return data

    def _read(self, source: Source, entry: Entry, key: str, expect: Callable[[str | None], str | None],
              keep: bool) -> tuple[bytes, bool, str | None]:
        """The cached copy's bytes, filled first on a miss; a copy of the wrong size is dropped and filled
        again. With whether they came straight from the source, checked as they came (too big for the budget;
        or, ``keep``, a small object this read filled, handed over as its fill held them: no read back), and
        ``expect(crc)``, asked once the copy is open and before it is read, with the CRC32C this read's fill
        computed, if it filled the copy (a copy this read filled needs no query of the index for it)."""
        path = self._layout.object_path(key)
        hit = True
        filled_crc = None  # what a verified read checks a copy this read filled against
        for _ in range(self.max_refetches + 3):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                hit = False
                filled = self._fills.fill_now(source, entry, keep=keep)
                if filled.fetched < 0:
                    return self._stream(source, entry, filled.refusal), True, None  # checked as it streamed
                if filled.data is not None:
                    return filled.data, True, None  # checked as it came
                filled_crc = filled.crc32c or None
                continue
            # No lock needed: eviction only unlinks, and an open descriptor still reads every byte.
            try:
                expected, filled_crc = expect(filled_crc), None
                data = _read_all(fd, entry.size)
            finally:
                os.close(fd)
            if len(data) == entry.size:
                self._counters.add(hits=int(hit), bytes_from_cache=len(data))
                self._index.used(key)
                return data, False, expected
            self._index.discard(key)
            self._counters.add(refetches=1)
            hit, keep = False, False  # the copy filled again is read back: a disk that keeps shortening it is named
        raise DamagedOnDisk(f"{where(source, printable(entry.name))}: the cached copy kept coming back the wrong size "
                            f"({self.max_refetches + 3} times): the local disk under {self.root} is failing; use a "
                            "cache folder on another disk")

    def _stream(self, source: Source, entry: Entry, refusal: str) -> bytes:
        warnings.warn(f"{where(source, printable(entry.name))} ({entry.size / 1e6:.1f} MB) does not fit in the cache "
                      f"{self._describe()}: {refusal}; reading it straight from the source", CacheFullWarning,
                      stacklevel=_callers_level())
        return self._fills.stream_now(source, entry)

    def _known_crc(self, entry: Entry, key: str, filled: str | None, wait: bool = True) -> str | None:
        """What a copy of ``entry`` must check against, as known now: the source's CRC32C, else the one its fill
        computed (``filled``: the caller's fill, just now; else the index's). Asked before the copy is read, while
        its row is there (an eviction right after the read would take the row, not the bytes read)."""
        if entry.crc32c:
            return entry.crc32c
        if filled:
            return filled
        return self._index.stored_crc(key, wait)

    def _settled_crc(self, key: str) -> str | None:
        """The CRC32C of a copy in place whose row was not written yet (another process's fill): its fill lock is
        held until the row is, so wait for it; None when there is still none (a copy no fill vouches for)."""
        with self._locks.hold(key):
            return self._index.stored_crc(key)

    def verified(self, source: Source, entry: Entry) -> bytes:
        """Every read back is checked: a failing disk can return other bytes than were written. A read that fills
        a small object is handed the bytes its fill checked as they came; once a copy read back wrong, the
        copies filled again are read back too, so a disk that keeps damaging them is named."""
        key = entry_key(source, entry)
        mismatches = unvouched = 0
        while mismatches <= self.max_refetches:
            data, streamed, expected = self._read(source, entry, key,
                                                  lambda filled: self._known_crc(entry, key, filled, wait=False),
                                                  keep=not (mismatches or unvouched))
            if streamed:
                return data
            expected = expected or self._known_crc(entry, key, None) or self._settled_crc(key)  # filled by this read
            if expected is not None and b64(google_crc32c.value(data)) == expected:
                return data
            if expected is None:  # another process evicted the copy and its row after we read it: nothing to
                unvouched += 1  # check the bytes against, which says nothing about the disk: read it again
                if unvouched > UNVOUCHED_READS:
                    raise CacheFolderError(errno.EAGAIN, f"{where(source, printable(entry.name))}: other processes "
                                           f"evicted its copy before it could be checked, {unvouched} times: the "
                                           f"cache {self.root} is too small for the readers sharing it; raise max_bytes")
            else:
                mismatches += 1  # bytes other than the ones written and checked: the disk
            self._index.discard(key)
            self._counters.add(refetches=1)
        raise self._damaged_on_disk(source, entry)

    def _damaged_on_disk(self, source: Source, entry: Entry) -> DamagedOnDisk:
        return DamagedOnDisk(f"{where(source, printable(entry.name))}: the cached copy kept reading back other bytes "
                             f"than were written and checked ({self.max_refetches + 1} times): the local disk under "
                             f"{self.root} is failing; use a cache folder on another disk")

    def _file_checks_out(self, f: BinaryIO, entry: Entry, key: str, filled: str | None) -> bool:
        """Whether the open cached copy ``f`` holds ``entry``'s bytes (size and CRC32C; ``filled``: the CRC32C of
        the caller's fill of it, if it just filled it); left at its start."""
        n, crc = stream_crc(f)
        f.seek(0)
        expected = self._known_crc(entry, key, filled) or self._settled_crc(key)  # the file is held open: its row stays
        return n == entry.size and expected is not None and crc == expected

    def open(self, source: Source, entry: Entry, filled_crc: str | None = None) -> BinaryIO:
        """``entry``'s copy, open and checked (``filled_crc``: the CRC32C of the caller's fill of it, just now)."""
        key = entry_key(source, entry)
        path = self._layout.object_path(key)
        hit, damaged_copies = True, 0
        while True:
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                hit = False
                filled = self._fills.fill_now(source, entry)
                if filled.fetched < 0:
                    return io.BytesIO(self._stream(source, entry, filled.refusal))
                filled_crc = filled.crc32c or None
                continue
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # eviction skips entries with a reader
            if os.fstat(f.fileno()).st_nlink == 0:  # evicted between open and lock: fill again
                f.close()
                continue
            checks_out, filled_crc = self._file_checks_out(f, entry, key, filled_crc), None
            if not checks_out:
                f.close()
                damaged_copies += 1
                if damaged_copies > self.max_refetches + 1:
                    raise self._damaged_on_disk(source, entry)
                self._index.discard(key)
                self._counters.add(refetches=1)
                hit = False
                continue
            self._counters.add(hits=int(hit))
            self._index.used(key)
            return f

    def path(self, source: Source, entry: Entry) -> Path:
        filled = self._fills.fill_now(source, entry)
        if filled.fetched >= 0:
            with self.open(source, entry, filled.crc32c or None) as f:  # checked; filled again if damaged
                if not isinstance(f, io.BytesIO):  # not streamed (evicted meanwhile, and then found no room)
                    return Path(self._layout.object_path(entry_key(source, entry)))
        raise CacheFolderError(errno.EFBIG, f"{where(source, printable(entry.name))} ({entry.size} bytes) does not "
                                            f"fit in the cache {self.root}, so it has no path there"
                                            f"{': ' + filled.refusal if filled.refusal else ''}; read it with read() or "
                                            "open(), or give the cache more room")
