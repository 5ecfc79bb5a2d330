"""What checked reads learned of each sample's cached copy, by sample number: a later read of the sample, in the
process that made the table or any process forked from it (DataLoader workers on Linux, before Python 3.14), reads its
copy again with no naming and no query of the index (:meth:`Cache.reread`). Under spawn or forkserver each worker
starts an empty table of its own.

In a persistent DataLoader worker, naming a sample and asking the index for its CRC32C took a tenth of decode-once's
sample. A shuffled sample goes to any worker each epoch, so the table is shared: anonymous shared memory, made by
the dataset whenever what decides which copy a sample reads is set (its listing, its source, decode-once's
decoding), before workers fork. Only ever a shortcut: each read is checked against what was learned, and one that
does not check out is read the slow way, which checks it against what the index says.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

import google_crc32c

from dataferry.cache.core import Cache

__all__ = ["KnownCopies"]

#: The key's SHA-256, the CRC32C of the bytes the sample uses and their size plus one (0: not learned)
_BODY = struct.Struct("<32sIq")
#: ... then the CRC32C of that body: a record torn by two writers, or scribbled on, fails it
_RECORD = struct.Struct("<32sIqI")


class KnownCopies:
    """For each of ``samples`` samples, the key of its copy and the size and CRC32C of the bytes it uses (a record's
    picture, not its padding), as a checked read learned them; 48 bytes a sample, in shared pages the kernel
    allocates as they are first touched. Pickles empty."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self._table = mmap.mmap(-1, max(1, samples) * _RECORD.size)  # MAP_SHARED: forked workers write to one

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.samples,)

    def read(self, cache: Cache, index: int, used_up: bool) -> bytes | None:
        """Sample ``index``'s bytes by what was learned of its copy (see :meth:`Cache.reread`); None when nothing was,
        or what was does not check out."""
        at = index * _RECORD.size
        record = self._table[at:at + _RECORD.size]
        if len(record) < _RECORD.size:  # a table for a shorter listing, set while this read began
            return None
        digest, crc, size, check = _RECORD.unpack(record)
        if not size or google_crc32c.value(record[:_BODY.size]) != check:
            return None
        return cache.reread(digest.hex(), size - 1, crc, used_up)

    def learn(self, index: int, key: str, data: bytes) -> None:
        """Note that sample ``index``'s copy, under ``key`` (a SHA-256 in hex), begins with ``data``, just checked."""
        body = _BODY.pack(bytes.fromhex(key), google_crc32c.value(data), len(data) + 1)
        at = index * _RECORD.size
        if at + _RECORD.size <= len(self._table):
            self._table[at:at + _RECORD.size] = body + google_crc32c.value(body).to_bytes(4, "little")
