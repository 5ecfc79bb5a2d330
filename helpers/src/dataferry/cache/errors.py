"""What goes wrong with a cache, as exceptions callers already catch (``OSError``, ``TimeoutError``,
``SourceError``) and the warning a streamed read gives. A fault of the cache's own disk is never a
``SourceError``: it is retried by nobody as if the network had failed."""

from __future__ import annotations

import errno
import sqlite3

from dataferry.errors import DataferryError
from dataferry.sources import SourceError

__all__ = ["ChecksumError", "DamagedAtSource", "DamagedOnDisk", "CacheFolderError", "CacheFullWarning",
           "CacheIndexWarning", "FillTimeout", "disk_full"]


class ChecksumError(DataferryError, RuntimeError):
    """An object's bytes did not match their CRC32C, every time: at the source (:class:`DamagedAtSource`) or
    on the cache's own disk (:class:`DamagedOnDisk`). Catch this for either."""


class DamagedAtSource(ChecksumError, SourceError):
    """The bytes did not match their checksum in every download: the object or the connection is damaged."""


class CacheFolderError(DataferryError, OSError):
    """The cache folder cannot be used (missing, read-only, not a cache, its disk failing): the
    message names the folder and what to do. Never retried as if the network had failed."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()

    @classmethod
    def opening(cls, root: object, e: OSError) -> CacheFolderError:
        """The cache folder ``root`` could not be made or opened with ``e``: why, by its errno."""
        why = {errno.ENOTDIR: "a part of its path is a file, not a folder: choose another path",
               errno.ENAMETOOLONG: "a name in its path is too long (255 bytes at most): choose a shorter one",
               errno.ENOENT: "a part of its path does not exist: check it"}.get(e.errno or 0)
        if why:
            return cls(e.errno, f"cannot use the cache folder {root} ({e.strerror}): {why}")
        return cls(e.errno, f"cannot write to the cache folder {root} ({e.strerror}): choose a writable folder, "
                            "e.g. /content/cache in Colab")

    @classmethod
    def writing(cls, e: OSError) -> CacheFolderError:
        """A write to the cache's disk that failed with ``e`` (its errno kept: a full disk stays one)."""
        return cls(e.errno, f"writing to the cache's disk failed ({e.strerror}): check the disk, or use a "
                            "cache folder on another one")


class DamagedOnDisk(ChecksumError, CacheFolderError):
    """The cached copy kept reading back other bytes than were written and checked: the cache's disk is at
    fault, not the source."""


class CacheFullWarning(UserWarning):
    """An object could not fit in the cache's budget and was read straight from the source."""


class CacheIndexWarning(UserWarning):
    """The cache's index was damaged (not a database any more) and was set aside for a new, empty one:
    what it held is downloaded again when read."""


class FillTimeout(DataferryError, TimeoutError):
    """A fill ran past its deadline while bytes still trickled in (never retried)."""


def disk_full(exc: BaseException) -> bool:
    """The cache's disk (or its index) ran out of space."""
    if isinstance(exc, sqlite3.OperationalError):
        return "full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC
