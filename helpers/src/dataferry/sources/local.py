"""A folder as a source: local disk, a Google Drive mount, a gcsfuse mount."""

from __future__ import annotations

import os
import stat as statmod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dataferry.host import on_network_filesystem
from dataferry.sources.base import CHUNK, ChangedAtSource, Entry, NotFoundAtSource, where
from dataferry.sources.beneath import open_beneath

__all__ = ["LocalSource"]


class LocalSource:
    """A folder: local disk, a Google Drive mount, a gcsfuse mount. Names are '/'-separated paths
    relative to ``root``, opened so that no link can lead outside ``root`` (:func:`open_beneath`)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.uri = self.root.as_uri()

    @property
    def remote(self) -> bool:
        """On a FUSE or network mount (Drive, gcsfuse), where each read can wait on the network; not on local disk."""
        return on_network_filesystem(self.root)

    def _open(self, name: str) -> int:
        try:
            return open_beneath(self.root, name)
        except FileNotFoundError:
            raise NotFoundAtSource(f"{where(self, name)} not found") from None

    @staticmethod
    def _entry(name: str, st: os.stat_result) -> Entry:
        return Entry(name, st.st_size, f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}-{st.st_ctime_ns}")

    def list(self) -> Iterator[Entry]:
        if not self.root.is_dir():
            raise NotFoundAtSource(f"{self.root} is not a folder: check the path (is the drive mounted?)")
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(self.root / rel if rel else self.root) as it:
                for d in it:
                    name = f"{rel}/{d.name}" if rel else d.name
                    if d.is_dir(follow_symlinks=False):
                        stack.append(name)
                    elif d.is_file(follow_symlinks=False):
                        yield self._entry(name, d.stat(follow_symlinks=False))

    def stat(self, name: str) -> Entry:
        fd = self._open(name)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not statmod.S_ISREG(st.st_mode):
            raise NotFoundAtSource(f"{where(self, name)} is not a regular file")
        return self._entry(name, st)

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        fd = self._open(entry.name)
        with open(fd, "rb", closefd=True) as f:
            if self._entry(entry.name, os.fstat(f.fileno())).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed since it was listed: list again")
            f.seek(start)
            n = 0
            while chunk := f.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
            # A file rewritten in place while we copied it would leave a mix of old and new bytes.
            if self._entry(entry.name, os.fstat(f.fileno())).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed while it was copied: nothing of it "
                                      "was kept; read it again for its new version")
        return n

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalSource, (self.root,))

    def __repr__(self) -> str:
        return f"LocalSource({str(self.root)!r})"
