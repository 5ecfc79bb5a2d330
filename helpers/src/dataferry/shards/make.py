"""Making shards: pack a folder or bucket prefix of files into tar shards of about a target size,
written to a folder or a bucket with an index (``index.json``: shard -> keys, samples, bytes,
CRC32C). Files are read through a verified cache, many at once; a sample never spans shards.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dataferry.cache import Cache
from dataferry.cache.checksum import file_crc
from dataferry.progress import progress_bar
from dataferry.shards.tar import ShardFormatError, TarShardWriter, split_name
from dataferry.errors import BadArgument
from dataferry.sources import Entry, NotFoundAtSource, Source, from_uri, where
from dataferry.sources.gcs import bucket_name

__all__ = ["SHARD_BYTES", "INDEX", "ShardInfo", "make_shards", "read_index"]

SHARD_BYTES = 64 << 20  # lesson 06's rule: tens of MB per shard, so per-request latency stops mattering
INDEX = "index.json"


@dataclass
class ShardInfo:
    """One shard as the index records it."""

    name: str
    samples: int = 0
    bytes: int = 0
    crc32c: str = ""
    keys: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<ShardInfo {self.name}: {self.samples} samples, {self.bytes / 1e6:.1f} MB>"


def _groups(entries: Sequence[Entry]) -> Iterator[tuple[str, list[Entry]]]:
    """Entries sorted by name, grouped into samples by key."""
    key, group = "", []  # type: tuple[str, list[Entry]]  # the first entry starts the first group
    for e in entries:
        parts = split_name(e.name)
        if parts is None:
            raise ShardFormatError(f"{e.name!r} has no extension: a shard member must be named key.ext "
                                   "(e.g. 0001.jpg, 0001.cls); rename it or leave it out with names=")
        if parts[0] != key and group:
            yield key, group
            group = []
        key = parts[0]
        group.append(e)
    if group:
        yield key, group


_TRAILER = 1024  # two zero blocks end a tar (the last record is then padded to 10 KiB)


def _member_bytes(e: Entry) -> int:
    """A member's bytes in a GNU tar: a header, a long-name header when the name needs one, data padded to 512."""
    long_name = 512 + len(e.name.encode()) + (-len(e.name.encode()) % 512) if len(e.name.encode()) >= 100 else 0
    return 512 + long_name + e.size + (-e.size % 512)


def _plan(entries: Sequence[Entry], shard_bytes: int) -> list[list[tuple[str, list[Entry]]]]:
    shards: list[list[tuple[str, list[Entry]]]] = [[]]
    filled = _TRAILER
    for key, group in _groups(entries):
        size = sum(_member_bytes(e) for e in group)
        if shards[-1] and filled + size > shard_bytes:
            shards.append([])
            filled = _TRAILER
        shards[-1].append((key, group))
        filled += size
    return [s for s in shards if s]


class _Destination:
    """A folder, or ``gs://bucket/prefix`` (google-cloud-storage, CRC32C-checked uploads)."""

    @staticmethod
    def check(dest: str | os.PathLike[str]) -> None:
        """Refuse a destination that cannot work before anything is read or made."""
        uri = str(dest)
        if uri.startswith("gs://"):
            bucket_name(uri[5:].partition("/")[0])
        elif not uri.strip():
            raise BadArgument("dest='': give a folder or gs://bucket/prefix for the shards")
        elif os.path.exists(uri) and not os.path.isdir(uri):
            raise BadArgument(f"{uri} is a file: the shards and their index go into a folder; choose another path")

    def __init__(self, dest: str | os.PathLike[str], client: Any = None) -> None:
        self.uri = str(dest)
        if self.uri.startswith("gs://"):
            if client is None:
                from google.cloud import storage

                client = storage.Client()
            bucket, _, prefix = self.uri[5:].partition("/")
            self._bucket = client.bucket(bucket)
            self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        else:
            self._bucket = None
            self._folder = Path(dest)
            self._folder.mkdir(parents=True, exist_ok=True)

    def put(self, name: str, path: Path) -> None:
        if self._bucket is None:
            shutil.copyfile(path, self._folder / f".{name}.partial")
            os.replace(self._folder / f".{name}.partial", self._folder / name)
        else:
            self._bucket.blob(self._prefix + name).upload_from_filename(str(path), checksum="crc32c")


def make_shards(source: Source | str, dest: str | os.PathLike[str], *, shard_bytes: int = SHARD_BYTES,
                names: Sequence[str] | None = None, pattern: str = "shard-{:05d}.tar", client: Any = None,
                progress: bool = True) -> list[ShardInfo]:
    """Pack the files of ``source`` (a :class:`~dataferry.sources.Source`, a folder or ``gs://bucket/prefix``;
    ``names`` to pick some) into tar shards of about ``shard_bytes`` in ``dest`` (a folder or
    ``gs://bucket/prefix``), then write ``index.json`` there. Files sort by name and group into samples by
    key (``0001.jpg`` and ``0001.cls`` make sample ``0001``). ``client``: the google-cloud-storage client for
    a bucket given as a string (default ``storage.Client()``). Returns the shards' index entries."""
    if type(shard_bytes) is not int or shard_bytes < 1:
        raise BadArgument(f"shard_bytes={shard_bytes!r}: give a whole number of bytes >= 1 (e.g. 64 << 20)")
    src = from_uri(source, client) if isinstance(source, str) else source
    _Destination.check(dest)
    entries = sorted(src.list() if names is None else (src.stat(n) for n in names), key=lambda e: e.name)
    if not entries:
        raise NotFoundAtSource(f"nothing to pack in {getattr(src, 'uri', src)}: check the path")
    plan = _plan(entries, shard_bytes)
    out = _Destination(dest, client)
    shards: list[ShardInfo] = []
    with tempfile.TemporaryDirectory(prefix="dataferry-shards-") as tmp, \
            progress_bar(progress, total=len(entries), desc=f"packing into {out.uri}", unit="file") as bar:
        cache = Cache(Path(tmp) / "cache", min_free_bytes=0)
        for i, groups in enumerate(plan):
            info = ShardInfo(pattern.format(i))
            members = [e for _, group in groups for e in group]
            errors = [f.error for f in cache.fill_many(src, members) if f.error is not None]
            if errors:
                raise errors[0]
            path = Path(tmp) / info.name
            with open(path, "wb") as f:
                writer = TarShardWriter(f)
                for key, group in groups:
                    for e in group:
                        writer.add(e.name, cache.read(src, e))
                    info.keys.append(key)
                    bar.update(len(group))
                writer.close()
            info.samples = len(info.keys)
            info.bytes, info.crc32c = file_crc(path)
            out.put(info.name, path)
            path.unlink()
            cache.clear()
            shards.append(info)
        index = Path(tmp) / INDEX
        index.write_text(json.dumps({"format": 1, "samples": sum(s.samples for s in shards),
                                     "bytes": sum(s.bytes for s in shards), "shards": [asdict(s) for s in shards]}))
        out.put(INDEX, index)
    return shards


def read_index(source: Source) -> dict[str, Any] | None:
    """The ``index.json`` that :func:`make_shards` wrote beside the shards, or None if there is none."""
    try:
        entry = source.stat(INDEX)
    except (NotFoundAtSource, FileNotFoundError):
        return None
    buf = io.BytesIO()
    source.fetch(entry, buf)
    try:
        index = json.loads(buf.getvalue())
        shards = index["shards"]
        if not all(isinstance(s["name"], str) and type(s["bytes"]) is int and type(s["samples"]) is int
                   for s in shards):
            raise TypeError("a shard's name, bytes or samples")
    except (ValueError, TypeError, KeyError) as e:
        raise ShardFormatError(f"{where(source, INDEX)} is not an index of shards ({e.__class__.__name__}: {e}): "
                               "it was damaged or written by something else; remake the shards with "
                               "`dataferry shards make`, or move it away to read the shards unchecked") from None
    return index
