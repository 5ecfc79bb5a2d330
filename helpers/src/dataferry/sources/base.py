"""What every source is: an :class:`Entry` per object, the :class:`Source` protocol, its errors,
and the check that an untrusted name stays under its root."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import BinaryIO, Protocol, overload, runtime_checkable

from dataferry.errors import DataferryError

__all__ = ["Entry", "EntryTable", "Source", "SourceError", "NotFoundAtSource", "NoCredentials", "ChangedAtSource",
           "fetches_async",
           "top_folders", "safe_name", "where", "CHUNK", "DEFAULT_RETRY_DEADLINE_S"]

CHUNK = 1 << 20
DEFAULT_RETRY_DEADLINE_S = 120.0


class SourceError(DataferryError, RuntimeError):
    """A source could not list or read; the message names the object and what to do."""


class NotFoundAtSource(SourceError, FileNotFoundError):
    """The object (or the bucket or folder) does not exist."""


class NoCredentials(SourceError, PermissionError):
    """No Google credentials were found to read a bucket; the message says how to sign in."""


class ChangedAtSource(SourceError):
    """The object changed at the source since it was listed: list again to get the new version."""


@dataclass(frozen=True)
class Entry:
    """One object: ``name`` relative to the source root, ``size`` in bytes, ``version`` (GCS
    generation, or size-mtime_ns-inode-ctime_ns for files: the change time is the one part a user cannot set back) and ``crc32c`` (base64, as GCS gives it) when known."""

    name: str
    size: int
    version: str
    crc32c: str | None = None


class EntryTable(Sequence[Entry]):
    """Entries held compactly: names, versions and checksums in three byte strings, sizes and
    offsets in ``array``\\s; an :class:`Entry` is made only when one is asked for.

    32 bytes per entry plus the bytes of its name, version and checksum (a list of
    :class:`Entry` costs ~270), and no per-entry Python objects, so DataLoader workers forked from
    the process share its pages instead of copying them as reference counts change."""

    def __init__(self, entries: Iterable[Entry] = (), *, sort_by_name: bool = False) -> None:
        columns: tuple[list, list, list] = ([], [], [])
        sizes = array("q")
        for e in entries:
            columns[0].append(e.name)
            columns[1].append(e.version)
            columns[2].append(e.crc32c or "")
            sizes.append(e.size)
        if sort_by_name and any(a > b for a, b in zip(columns[0], columns[0][1:])):  # a bucket lists sorted
            order = sorted(range(len(sizes)), key=columns[0].__getitem__)
            columns = tuple([column[i] for i in order] for column in columns)  # type: ignore[assignment]
            sizes = array("q", (sizes[i] for i in order))
        self._sizes = sizes
        self._blobs, self._ends = {}, {}
        for field, column in zip(("name", "version", "crc32c"), columns):
            encoded = [text.encode("utf-8", "surrogateescape") for text in column]
            self._blobs[field] = b"".join(encoded)
            self._ends[field] = array("q", accumulate(map(len, encoded)))

    def _text(self, field: str, i: int) -> str:
        ends = self._ends[field]
        return self._blobs[field][ends[i - 1] if i else 0:ends[i]].decode("utf-8", "surrogateescape")

    def __len__(self) -> int:
        return len(self._sizes)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        return Entry(self._text("name", i), self._sizes[i], self._text("version", i), self._text("crc32c", i) or None)

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes)

    def __repr__(self) -> str:
        return f"<EntryTable {len(self)} entries, {self.total_bytes / 1e6:.1f} MB>"


@runtime_checkable
class Source(Protocol):
    """What the cache needs from a place where bytes live. A source may also say ``remote`` (False for a
    folder on local disk: see :func:`reads_wait_on_network`), and list its ``folders()`` at the top (empty ones
    included: see :func:`top_folders`)."""

    uri: str

    def list(self) -> Iterator[Entry]:
        """Every entry, streamed in the source's order."""

    def stat(self, name: str) -> Entry:
        """The current entry for ``name``; :class:`NotFoundAtSource` if there is none."""

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        """Write the bytes of ``entry`` from offset ``start`` to ``out``; return how many were written.
        ``timeout`` bounds each network wait (connecting, and each gap between bytes: a stall).
        Raises :class:`ChangedAtSource` when that version is gone."""


def reads_wait_on_network(source: Source) -> bool:
    """Whether a read of ``source`` can wait on the network: a source says so with ``remote`` (a folder on
    local disk says False, a Drive or gcsfuse mount True); one that does not say is taken to (a bucket)."""
    return bool(getattr(source, "remote", True))


def top_folders(source: Source, entries: Iterable[Entry]) -> list[str]:
    """The folders at the top of ``source``, sorted: its own ``folders()`` where it has them (they include empty
    folders), else the first parts of the ``entries``' names that have a '/'."""
    folders = getattr(source, "folders", None)
    if folders is not None:
        return sorted(folders())
    return sorted({e.name.split("/", 1)[0] for e in entries if "/" in e.name})


def fetches_async(source: Source) -> bool:
    """Whether ``source`` offers ``fetch_async`` (a bucket): then many downloads share one event loop."""
    return hasattr(source, "fetch_async")


def where(source: Source, name: str) -> str:
    """``source.uri`` and ``name`` joined by one '/', for messages: ``file:///data/sub/x.bin``."""
    return f"{source.uri.rstrip('/')}/{name}"


def safe_name(name: str) -> str:
    """Check an untrusted object name for use under a root folder, or raise ``ValueError``.

    Refuses NUL, absolute paths, empty names and any ``.``/``..`` component, so a joined path
    cannot leave the root (control characters and unicode are fine: they stay inside)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"invalid object name {name!r}: empty")
    if "\0" in name:
        raise ValueError(f"invalid object name {name!r}: contains NUL")
    if name.startswith("/"):
        raise ValueError(f"invalid object name {name!r}: absolute paths are not allowed")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"invalid object name {name!r}: '.', '..' and empty path parts are not allowed")
    return name
