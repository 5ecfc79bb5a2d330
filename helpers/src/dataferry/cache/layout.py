"""Keys and layout: where an object lives in the cache folder, whatever its name.

An entry's key is a hash of (source, name, version), so object names never become paths and a
changed object is a new key. The folder, laid out once::

    index.sqlite     entries: key, source, name, version, size, crc32c, state, pid, last_used (WAL)
    objects/ab/KEY           complete objects
    objects/ab/KEY.PID.part  fills in progress, beside their place (removed at the next open if PID is dead)
    locks/fill.lock  fill locks: one byte per key (open-file-description locks)
    CACHEDIR.TAG     "safe to delete", for backup tools
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dataferry.cache.errors import CacheFolderError
from dataferry.sources import Entry, Source
from dataferry.sources.base import CHUNK

__all__ = ["Layout", "key", "utf8", "printable", "CHUNK"]

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


class Layout:
    """Every path of one cache folder (the map above): no other module joins a path under it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects, self.locks = str(root / "objects"), str(root / "locks")
        self.old_tmp = str(root / "tmp")  # where earlier versions kept temp files: cleaned at open, never written
        self.index = root / "index.sqlite"
        self.index_lock = f"{self.locks}/index.lock"
        self.fill_lock = f"{self.locks}/fill.lock"

    def __repr__(self) -> str:
        return f"Layout({str(self.root)!r})"

    def object_path(self, key: str) -> str:
        return f"{self.objects}/{key[:2]}/{key}"

    def set_aside_path(self, stamp: str) -> Path:
        """Where a damaged index is moved, for a post-mortem."""
        return self.index.with_name(f"index.sqlite.damaged-{stamp}-{os.getpid()}")

    def temp_path(self, key: str, pid: int) -> str:
        """A fill's temp file, in the folder of its object: a rename within one folder is cheap, while
        one across folders takes the file system's rename lock (``s_vfs_rename_mutex`` on Linux), which
        made parallel fills queue (1.4x the CPU per file of two processes filling, measured)."""
        return f"{self.objects}/{key[:2]}/{key}.{pid}.part"

    @staticmethod
    def temp_pid(name: str) -> int:
        """The process that writes the temp file ``name`` (-1 when the name is not a temp file)."""
        if not name.endswith(".part"):
            return -1
        try:
            return int(name.split(".")[-2])
        except (ValueError, IndexError):
            return -1

    def shelves(self) -> list[str]:
        """The folders under ``objects/`` (one per first two hex digits of a key), in order."""
        return sorted(os.listdir(self.objects))

    def shelf(self, sub: str) -> str:
        return f"{self.objects}/{sub}"

    @staticmethod
    def data_folders(root: Path) -> list[Path]:
        """Where a cache folder keeps its data (whole objects and fills in progress); ``[root]`` for a
        folder that is not a dataferry cache."""
        return [root / "objects"] if (root / "index.sqlite").exists() else [root]

    def make(self) -> None:
        """Make the folder's layout (once) and check it is writable: :class:`CacheFolderError` if not."""
        root = self.root
        try:
            if not (root / "objects" / "ff").is_dir():
                for sub in ("tmp", "locks", *(f"objects/{i:02x}" for i in range(256))):  # tmp: for earlier versions
                    (root / sub).mkdir(parents=True, exist_ok=True)
            tag = root / "CACHEDIR.TAG"
            if not tag.exists():
                tag.write_text(_TAG)
            if not os.access(root, os.W_OK):
                raise PermissionError(13, "read-only")
        except OSError as e:
            raise CacheFolderError.opening(root, e) from None
