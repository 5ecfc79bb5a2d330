"""A verified, crash-safe local cache of objects from a :class:`~dataferry.sources.Source`.

Each object is stored once per machine under a name derived from (source, object name, version),
never from the object name itself, so hostile names cannot reach outside the cache folder and a
changed object is a different entry (never served stale). A fill downloads to a temp file in the
cache folder while computing CRC32C, checks size and checksum, makes it durable and renames it
into place: a file under ``objects/`` is always complete and verified, at any instant of a crash.

Many threads, DataLoader workers and processes may share one cache folder. :class:`Cache` is the
face over parts it composes, each owning one idea, lowest first:

- :mod:`~dataferry.cache.errors`: what goes wrong, as exceptions callers already catch;
- :mod:`~dataferry.cache.layout`: keys, names and every path of the folder (:class:`Layout`);
- :mod:`~dataferry.cache.checksum`: CRC32C of files, and of ranges joined;
- :mod:`~dataferry.cache.counters`: this process's counters (:class:`CacheStats`);
- :mod:`~dataferry.cache.locks`: fill locks (one download per object per machine), fork safety;
- :mod:`~dataferry.cache.store`: the SQLite file, its schema and statements that need no writer;
- :mod:`~dataferry.cache.budget`: room under ``max_bytes`` / ``min_free_bytes``, LRU eviction;
- :mod:`~dataferry.cache.index`: connections, transactions and the thread that writes the index in batches;
- :mod:`~dataferry.cache.placing`: the download loop's finished fills put in place a group at a time;
- :mod:`~dataferry.cache.transport`: how a fill's bytes travel, one transport per kind of source;
- :mod:`~dataferry.cache.sides`: where a fill runs (the caller's thread, or the download loop);
- :mod:`~dataferry.cache.fill`: the one fill engine, with retries, checks and a deadline;
- :mod:`~dataferry.cache.many`: many fills at once, and fills ahead of a reader;
- :mod:`~dataferry.cache.recovery`: cleaning up after crashes, ``verify`` and ``clear``;
- :mod:`~dataferry.cache.core`: :class:`Cache`, the face.
"""

from dataferry.cache.budget import DEFAULT_MIN_FREE_BYTES, Refusal
from dataferry.cache.core import Cache
from dataferry.cache.counters import CacheStats
from dataferry.cache.errors import (CacheFolderError, CacheFullWarning, CacheIndexWarning, ChecksumError, DamagedAtSource,
                                    DamagedOnDisk, FillTimeout)
from dataferry.cache.fill import Filled
from dataferry.cache.recovery import VerifyReport

__all__ = ["Cache", "CacheStats", "Filled", "VerifyReport", "ChecksumError", "DamagedAtSource", "DamagedOnDisk", "CacheFullWarning", "CacheIndexWarning", "CacheFolderError",
           "FillTimeout", "Refusal", "DEFAULT_MIN_FREE_BYTES"]
