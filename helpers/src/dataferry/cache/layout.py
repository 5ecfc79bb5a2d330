"""Keys and layout: where an object lives in the cache folder, whatever its name.

An entry's key is a hash of (source, name, version), so object names never become paths and a
changed object is a new key. The folder, laid out once::

    index.sqlite     entries: key, source, name, version, size, crc32c, state, pid, last_used (WAL)
    objects/ab/KEY   complete objects
    tmp/KEY.PID.part fills in progress (removed at the next open if PID is dead)
    locks/fill.lock  fill locks: one byte per key (open-file-description locks)
    CACHEDIR.TAG     "safe to delete", for backup tools
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dataferry.cache.errors import CacheFolderError
from dataferry.sources import Entry, Source

__all__ = ["key", "lay_out", "utf8", "printable", "CHUNK"]

CHUNK = 1 << 20
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# dataferry cache: safe to delete\n"


def utf8(name: str) -> bytes:
    """A name's bytes: names read from a folder may hold bytes that are not UTF-8 (surrogate-escaped)."""
    return name.encode("utf-8", "surrogateescape")


def printable(name: str) -> str:
    """A name as the index stores and messages show it (undecodable bytes as \\xNN)."""
    return utf8(name).decode("utf-8", "backslashreplace")


def key(source: Source, entry: Entry) -> str:
    """The entry's key: a hash of (source, name, version); object names never become paths."""
    return hashlib.sha256(utf8(f"{source.uri}\0{entry.name}\0{entry.version}")).hexdigest()


def lay_out(root: Path) -> None:
    """Make the folder's layout (once) and check it is writable: :class:`CacheFolderError` if not."""
    try:
        if not (root / "objects" / "ff").is_dir():
            for sub in ("tmp", "locks", *(f"objects/{i:02x}" for i in range(256))):
                (root / sub).mkdir(parents=True, exist_ok=True)
        tag = root / "CACHEDIR.TAG"
        if not tag.exists():
            tag.write_text(_TAG)
        if not os.access(root, os.W_OK):
            raise PermissionError(13, "read-only")
    except OSError as e:
        raise CacheFolderError.opening(root, e) from None
