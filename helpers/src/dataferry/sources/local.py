"""A folder as a source: local disk, a Google Drive mount, a gcsfuse mount."""

from __future__ import annotations

import builtins
import os
import stat as statmod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dataferry.errors import BadArgument
from dataferry.host import on_fuse, on_network_filesystem
from dataferry.sources.base import (CHUNK, ChangedAtSource, Entry, NotFoundAtSource, SourceError, safe_name,
                                    where)
from dataferry.sources.beneath import open_beneath

__all__ = ["LocalSource"]


class LocalSource:
    """A folder: local disk, a Google Drive mount, a gcsfuse mount. Names are '/'-separated paths
    relative to ``root``; a name never leads outside it by ``..`` or an absolute path (:func:`safe_name`).

    Links in the folder are followed, as ``os.walk(followlinks=True)`` and torchvision's ``ImageFolder`` follow
    them: a linked file or folder is listed and read like any other (each linked folder once per path, never
    round a loop; a link to nothing is left out). ``follow_links=False`` is for a folder you do not trust (a
    mounted public bucket): links are then neither listed nor read, and no link, however it is swapped in
    meanwhile, leads a read outside ``root`` (:func:`open_beneath`)."""

    def __init__(self, root: str | os.PathLike[str], *, follow_links: bool = True) -> None:
        if isinstance(root, str) and not root.strip():
            raise BadArgument("LocalSource(''): give a folder (an empty path would read the current folder)")
        if type(follow_links) is not bool:
            raise BadArgument(f"follow_links={follow_links!r}: give True or False")
        self.root = Path(root).absolute()
        self._root = str(self.root).rstrip("/")  # joined by hand: a Path per read cost more than the open
        self.uri = self.root.as_uri()
        self.follow_links = follow_links
        self._numbered: dict[int, bool] = {}  # by device: whether its inode numbers are the files' own (not FUSE)

    @property
    def remote(self) -> bool:
        """On a FUSE or network mount (Drive, gcsfuse), where each read can wait on the network; not on local disk."""
        return on_network_filesystem(self.root)

    def _open(self, name: str) -> int:
        try:
            if not self.follow_links:
                return open_beneath(self.root, name)
            safe_name(name)
            return os.open(f"{self._root}/{name}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block us
        except FileNotFoundError:
            raise NotFoundAtSource(f"{where(self, name)} not found") from None
        except ValueError as e:
            raise BadArgument(str(e)) from None

    def _entry(self, name: str, st: os.stat_result) -> Entry:
        numbered = self._numbered.get(st.st_dev)
        if numbered is None:
            # On FUSE the number says nothing of the file (gcsfuse renumbers a file after the kernel forgot it, after
            # a remount): a version with it would be "changed" mid-epoch and keyed anew.
            numbered = self._numbered[st.st_dev] = not on_fuse(f"{self._root}/{name}")
        number = st.st_ino if numbered else ""
        return Entry(name, st.st_size, f"{st.st_size}-{st.st_mtime_ns}-{number}-{st.st_ctime_ns}")

    def list(self) -> Iterator[Entry]:
        follow = self.follow_links
        self._numbered = {}  # a device number freed by an unmount can come back as another file system's
        try:
            top = os.stat(self.root)
        except OSError:
            top = None
        if top is None or not statmod.S_ISDIR(top.st_mode):
            raise NotFoundAtSource(f"{self.root} is not a folder: check the path (is the drive mounted?)")
        stack: list[tuple[str, tuple[tuple[int, int], ...]]] = [("", ((top.st_dev, top.st_ino),))]
        while stack:
            rel, above = stack.pop()  # above: the folders on the way here, so that a link never leads round a loop
            try:
                it = os.scandir(self.root / rel if rel else self.root)
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone since it was listed
            except PermissionError:
                raise SourceError(f"{where(self, rel or '')} cannot be listed (permission denied): its files would be "
                                  "left out; make it readable, or move it out of the folder") from None
            with it:
                for d in it:
                    name = f"{rel}/{d.name}" if rel else d.name
                    try:
                        if d.is_dir(follow_symlinks=follow):
                            st = d.stat(follow_symlinks=follow)
                            if (st.st_dev, st.st_ino) not in above:
                                stack.append((name, (*above, (st.st_dev, st.st_ino))))
                        elif d.is_file(follow_symlinks=follow):
                            yield self._entry(name, d.stat(follow_symlinks=follow))
                    except FileNotFoundError:  # deleted, or a link to nothing
                        continue

    def folders(self) -> builtins.list[str]:
        """The folders at the top of the source, empty ones included (through links unless ``follow_links``
        is False): what ``ImageFolder`` takes for its classes."""
        if not self.root.is_dir():
            raise NotFoundAtSource(f"{self.root} is not a folder: check the path (is the drive mounted?)")
        with os.scandir(self.root) as it:
            return sorted(d.name for d in it if d.is_dir(follow_symlinks=self.follow_links))

    def stat(self, name: str) -> Entry:
        fd = self._open(name)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not statmod.S_ISREG(st.st_mode):
            what = "a folder" if statmod.S_ISDIR(st.st_mode) else "not a regular file"
            raise NotFoundAtSource(f"{where(self, name)} is {what}, not a file: list the source again")
        return self._entry(name, st)

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        fd = self._open(entry.name)
        try:
            st = os.fstat(fd)
            if not statmod.S_ISREG(st.st_mode):  # a folder or a device in its place since it was listed
                raise ChangedAtSource(f"{where(self, entry.name)} is no longer a file: list again")
            if self._entry(entry.name, st).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed since it was listed: list again")
            n, at = 0, start
            while True:
                # Up to one byte past the listed end: a short read there is the end, so a small file costs one read.
                want = min(CHUNK, entry.size - at + 1) if at < entry.size else CHUNK
                chunk = os.pread(fd, want, at)
                if not chunk:
                    break
                out.write(chunk)
                n, at = n + len(chunk), at + len(chunk)
                if at >= entry.size and len(chunk) < want:
                    break
            # A file rewritten in place while we copied it would leave a mix of old and new bytes.
            if self._entry(entry.name, os.fstat(fd)).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed while it was copied: nothing of it "
                                      "was kept; read it again for its new version")
        finally:
            os.close(fd)
        return n

    def __reduce__(self) -> tuple[Any, ...]:
        return (_local_source, (self.root, self.follow_links))

    def __repr__(self) -> str:
        return f"LocalSource({str(self.root)!r}{'' if self.follow_links else ', follow_links=False'})"


def _local_source(root: Path, follow_links: bool) -> LocalSource:
    return LocalSource(root, follow_links=follow_links)
