"""A verified, crash-safe local cache of objects from a :class:`~dataferry.sources.Source`.

Each object is stored once per machine under a name derived from (source, object name, version),
never from the object name itself, so hostile names cannot reach outside the cache folder and a
changed object is a different entry (never served stale). A fill downloads to a temp file in the
cache folder while computing CRC32C, checks size and checksum, makes it durable and renames it
into place: a file under ``objects/`` is always complete and verified, at any instant of a crash.

Many threads, DataLoader workers and processes may share one cache folder. :class:`Cache` is the
face; one idea per module behind it:

- :mod:`~dataferry.cache.layout`: keys, names and the folder;
- :mod:`~dataferry.cache.locks`: fill locks (one download per object per machine), fork safety;
- :mod:`~dataferry.cache.index`: the SQLite index and the thread that writes it in batches;
- :mod:`~dataferry.cache.fill`: filling, with retries, checks and a deadline;
- :mod:`~dataferry.cache.bulk`: many fills at once on one event loop, large objects in ranges;
- :mod:`~dataferry.cache.checksum`: CRC32C of files, and of ranges joined;
- :mod:`~dataferry.cache.budget`: room under ``max_bytes`` / ``min_free_bytes``, LRU eviction;
- :mod:`~dataferry.cache.recovery`: cleaning up after crashes, ``verify`` and ``clear``;
- :mod:`~dataferry.cache.errors`: what goes wrong, as exceptions callers already catch.
"""

from dataferry.cache.budget import DEFAULT_MIN_FREE_BYTES, Refusal
from dataferry.cache.core import Cache, CacheStats
from dataferry.cache.errors import (CacheFolderError, CacheFullWarning, CacheIndexWarning, ChecksumError, DamagedAtSource,
                                    DamagedOnDisk, FillTimeout)
from dataferry.cache.recovery import VerifyReport

__all__ = ["Cache", "CacheStats", "VerifyReport", "ChecksumError", "DamagedAtSource", "DamagedOnDisk", "CacheFullWarning", "CacheIndexWarning", "CacheFolderError",
           "FillTimeout", "Refusal", "DEFAULT_MIN_FREE_BYTES"]
