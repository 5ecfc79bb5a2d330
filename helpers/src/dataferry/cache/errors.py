"""What goes wrong with a cache, as exceptions callers already catch (``OSError``, ``TimeoutError``,
``SourceError``) and the warning a streamed read gives."""

from __future__ import annotations

from dataferry.sources import SourceError

__all__ = ["ChecksumError", "CacheFolderError", "CacheFullWarning", "CacheIndexWarning", "FillTimeout"]


class ChecksumError(SourceError):
    """An object's bytes did not match its checksum, every time it was downloaded."""


class CacheFolderError(OSError):
    """The cache folder cannot be used (missing, read-only, not a cache, its disk failing): the
    message names the folder and what to do. Never retried as if the network had failed."""

    @classmethod
    def writing(cls, e: OSError) -> CacheFolderError:
        """A write to the cache's disk that failed with ``e`` (its errno kept: a full disk stays one)."""
        return cls(e.errno, f"writing to the cache's disk failed ({e.strerror}): check the disk, or use a "
                            "cache folder on another one")


class CacheFullWarning(UserWarning):
    """An object could not fit in the cache's budget and was read straight from the source."""


class CacheIndexWarning(UserWarning):
    """The cache's index was damaged (not a database any more) and was set aside for a new, empty one:
    what it held is downloaded again when read."""


class FillTimeout(TimeoutError):
    """A fill ran past its deadline while bytes still trickled in (never retried)."""
