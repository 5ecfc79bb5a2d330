"""Synthetic training sets for lab buckets, deterministic from a seed.

A dataset is N sample files in nested folders, of one size or drawn from a log-normal size
distribution, plus the same samples packed in tar shards (WebDataset layout), plus a manifest.
The bytes of every file follow from (seed, name) alone, so a test can check what it read without
keeping a copy, and the same call always makes the same bucket contents::

    prefix/files/03/01/sample-000123.bin
    prefix/shards/shard-00000.tar        members named 03/01/sample-000123.bin, in sample order
    prefix/manifest.json                 seed, sizes and crc32c of every file and shard
"""

from __future__ import annotations

import base64
import io
import json
import math
import random
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c

from dataferry.errors import BadArgument

__all__ = ["LogNormal", "SyntheticDataset", "plan_dataset", "sample_bytes", "crc32c_b64"]


@dataclass(frozen=True)
class LogNormal:
    """File sizes drawn from a log-normal distribution around ``median_bytes``, clipped to a range."""

    median_bytes: int
    sigma: float = 1.0
    min_bytes: int = 1
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma >= 0):
            raise BadArgument(f"sigma={self.sigma!r}: the spread of a log-normal is a finite number >= 0")
        if type(self.median_bytes) is not int or self.median_bytes < 1:
            raise BadArgument(f"median_bytes={self.median_bytes!r}: give a whole number of bytes >= 1")

    def sample(self, rng: random.Random) -> int:
        size = int(round(rng.lognormvariate(math.log(self.median_bytes), self.sigma)))
        size = max(self.min_bytes, size)
        return min(size, self.max_bytes) if self.max_bytes else size


def sample_bytes(seed: int, name: str, size: int) -> bytes:
    """The content of sample ``name`` in a dataset made with ``seed``."""
    return random.Random(f"{seed}:{name}").randbytes(size)


def crc32c_b64(data: bytes) -> str:
    """CRC32C as GCS reports it: base64 of the big-endian 4-byte value."""
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _tar_shard(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class SyntheticDataset:
    """Names and sizes of a synthetic dataset; bytes are generated on demand from the seed."""

    prefix: str
    seed: int
    sizes: dict[str, int]  # sample key (relative to prefix/files/) -> bytes, in sample order
    shard_bytes: int | None
    bucket: str | None = None
    shards: dict[str, list[str]] = field(default_factory=dict)  # shard object name -> member keys

    def __post_init__(self) -> None:
        if self.shard_bytes and not self.shards:
            self.shards = self._plan_shards()

    @property
    def n_files(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def object_name(self, key: str) -> str:
        """The bucket object name of sample ``key``."""
        return f"{self.prefix}/files/{key}"

    @property
    def object_names(self) -> list[str]:
        return [self.object_name(k) for k in self.sizes]

    def content(self, key: str) -> bytes:
        """The bytes of sample ``key`` (a key, or its full object name)."""
        key = key.removeprefix(f"{self.prefix}/files/")
        return sample_bytes(self.seed, key, self.sizes[key])

    def _plan_shards(self) -> dict[str, list[str]]:
        shards: dict[str, list[str]] = {}
        current: list[str] = []
        filled = 0
        for key, size in self.sizes.items():
            if current and self.shard_bytes is not None and filled + size > self.shard_bytes:
                shards[f"{self.prefix}/shards/shard-{len(shards):05d}.tar"] = current
                current, filled = [], 0
            current.append(key)
            filled += size
        if current:
            shards[f"{self.prefix}/shards/shard-{len(shards):05d}.tar"] = current
        return shards

    def shard_content(self, shard: str) -> bytes:
        """The bytes of a tar shard: its samples in order, with fixed metadata (reproducible)."""
        return _tar_shard([(k, self.content(k)) for k in self.shards[shard]])

    def objects(self) -> Iterator[tuple[str, bytes]]:
        """Every object of the dataset as (name, bytes): samples, shards, then the manifest."""
        for key in self.sizes:
            yield self.object_name(key), self.content(key)
        for shard in self.shards:
            yield shard, self.shard_content(shard)
        yield f"{self.prefix}/manifest.json", self.manifest()

    def manifest(self) -> bytes:
        return json.dumps(
            {"prefix": self.prefix, "seed": self.seed, "shard_bytes": self.shard_bytes,
             "files": self.sizes, "shards": self.shards},
            indent=1,
        ).encode()

    def upload(self, bucket, workers: int = 8) -> SyntheticDataset:
        """Write every object to a google-cloud-storage ``Bucket`` (in parallel)."""

        def put(item: tuple[str, bytes]) -> None:
            name, data = item
            bucket.blob(name).upload_from_string(data, content_type="application/octet-stream", checksum="crc32c")

        with ThreadPoolExecutor(workers) as pool:
            for _ in pool.map(put, self.objects()):
                pass
        self.bucket = bucket.name
        return self

    def write_to(self, folder) -> SyntheticDataset:
        """Write every object under a local ``folder`` (a stand-in for a mount, or a baseline copy)."""
        root = Path(folder)
        for name, data in self.objects():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return self

    def __repr__(self) -> str:
        where = f"gs://{self.bucket}/{self.prefix}" if self.bucket else self.prefix
        return (f"<SyntheticDataset {where}: {self.n_files} files, {self.total_bytes / 1e6:.1f} MB, "
                f"{len(self.shards)} shards, seed {self.seed}>")


def plan_dataset(
    n_files: int,
    size: int | LogNormal,
    *,
    prefix: str = "data",
    seed: int = 0,
    fanout: int = 4,
    depth: int = 2,
    shard_bytes: int | None = 64 * 2**20,
) -> SyntheticDataset:
    """Plan a dataset: ``n_files`` samples of ``size`` bytes (or a :class:`LogNormal`), in
    ``depth`` levels of ``fanout`` folders, packed into tar shards of about ``shard_bytes``
    (None: no shards). Nothing is generated or uploaded until asked."""
    if n_files < 0:
        raise ValueError("n_files must be >= 0")
    if isinstance(size, int) and size < 0:
        raise ValueError("size must be >= 0")
    rng = random.Random(seed)
    sizes: dict[str, int] = {}
    for i in range(n_files):
        folders = [f"{(i // fanout**level) % fanout:02d}" for level in range(depth)]
        key = "/".join([*folders, f"sample-{i:06d}.bin"])
        sizes[key] = size if isinstance(size, int) else size.sample(rng)
    return SyntheticDataset(prefix=prefix.strip("/"), seed=seed, sizes=sizes, shard_bytes=shard_bytes)
