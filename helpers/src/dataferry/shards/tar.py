"""The tar side of shards: WebDataset's layout (members grouped by key, ``key.ext``), read from the
bytes of a whole shard and written reproducibly.

A member ``train/0001.jpg`` belongs to sample ``train/0001`` as its ``jpg`` field: the key is the
path up to the first dot of the file name, as in WebDataset, and consecutive members with the
same key make one sample.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from dataferry.errors import DataferryError

__all__ = ["ShardFormatError", "split_name", "samples", "TarShardWriter"]

_KEY_EXT = re.compile(r"^((?:.*/|)[^./][^./]*)\.([^/]+)$")


class ShardFormatError(DataferryError, ValueError):
    """A shard that is not a tar in WebDataset's layout, or a file that cannot become a member."""


def split_name(name: str) -> tuple[str, str] | None:
    """``("dir/0001", "jpg")`` for ``dir/0001.jpg``; None for a name with no extension or a hidden file."""
    m = _KEY_EXT.match(name)
    return (m[1], m[2]) if m else None


def samples(data: bytes, url: str) -> Iterator[dict]:
    """The samples of one shard's bytes: ``{"__key__": key, "__url__": url, ext: bytes, ...}`` in
    member order. Members that are not files, or have no extension, are skipped (as WebDataset does)."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as e:
        raise ShardFormatError(f"{url} is not a tar shard ({e}); make shards with `dataferry shards make`") from None
    current: dict | None = None
    with tar:
        for info in tar:
            parts = split_name(info.name) if info.isfile() else None
            if parts is None:
                continue
            key, ext = parts
            if current is None or current["__key__"] != key:
                if current is not None:
                    yield current
                current = {"__key__": key, "__url__": url}
            if ext in current:
                raise ShardFormatError(f"{url}: sample {key!r} has two {ext!r} members")
            current[ext] = data[info.offset_data:info.offset_data + info.size]
    if current is not None:
        yield current


class TarShardWriter:
    """Writes members into one tar file with fixed metadata (mtime 0, mode 0644, no owner), so the
    same samples always make the same bytes."""

    def __init__(self, out: BinaryIO) -> None:
        self._tar = tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT)
        self.members = 0

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        self._tar.addfile(info, io.BytesIO(data))
        self.members += 1

    def close(self) -> None:
        self._tar.close()

    def __repr__(self) -> str:
        return f"<TarShardWriter {self.members} members>"
