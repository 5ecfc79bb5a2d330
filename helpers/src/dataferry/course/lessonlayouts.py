"""Lesson 06's front door and measurement: the same samples as many small files and as few large objects
(tar shards, or in the public data large Landsat bands), read four ways with the server's requests counted.

In the lab and in your own bucket (``WHERE = "mine"``) the samples are written in both layouts; the public
buckets cannot be written, so there the small files are the public images and the large objects a
Landsat scene's bands: other bytes, compared per byte.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.course.lessondata import crossing, region_label

if TYPE_CHECKING:
    from dataferry.course.run import Course

__all__ = ["Layouts", "two_layouts", "read_shard", "measure_layouts"]


@dataclass
class Layouts:
    """Small files (``keys`` under ``small_prefix`` of ``bucket``) and large objects (``large`` under
    ``large_prefix`` of ``large_bucket``): shards of the same samples when ``shards``, else other data."""

    client: Any
    bucket: str
    small_prefix: str
    keys: list[str]
    large_bucket: str
    large_prefix: str
    large: list[str]
    sizes: dict[str, int]
    shards: bool
    label: str
    about: str
    contents: Callable[[str], bytes] | None = None
    lab: Any = field(default=None, repr=False)
    profile: str | None = None
    locations: tuple[str, str] = ("", "")

    @property
    def small_name(self) -> str:
        return "files"

    @property
    def large_name(self) -> str:
        return "shards" if self.shards else "large objects"

    @property
    def file_bytes(self) -> float:
        return sum(self.sizes[k] for k in self.keys) / len(self.keys)

    @property
    def large_bytes(self) -> float:
        sizes = {b.name: b.size for b in self.client.list_blobs(self.large_bucket, prefix=self.large_prefix)}
        return sum(sizes[n] for n in self.large) / len(self.large)

    def network(self) -> contextlib.AbstractContextManager[str]:
        """The lab's profile inside the ``with`` (the old one back after); elsewhere the network as it is."""
        return crossing(self.lab, self.profile, self.label)

    def __str__(self) -> str:
        return self.about


def two_layouts(course: Course, n: int, file_bytes: int, shard_bytes: int, *, seed: int = 0, bucket: str = "",
                prefix: str = "", large_files: int = 2, profile: str = "same-continent") -> Layouts:
    """``n`` samples of ``file_bytes`` as files and in tar shards of about ``shard_bytes`` (the lab, or your
    ``bucket``/``prefix``, written); or, from the public data, ``n`` images and ``large_files`` Landsat bands."""
    if course.where in ("lab", "mine"):
        from dataferry.course.lab.datasets import plan_dataset

        if course.where == "lab":
            from dataferry.course.lab import Lab

            lab: Any = Lab().up()
            name, client, top = "l06-data", lab.client(), "d"
            lab.empty_bucket(name)
            dataset = plan_dataset(n, file_bytes, prefix=top, seed=seed, shard_bytes=shard_bytes)
            dataset.upload(lab.client(direct=True).bucket(name))
            label, where = f"lab:{profile}", f"under the lab's {profile!r} profile (lab numbers, not cloud numbers)"
        else:
            cloud = course.cloud_data(bucket, prefix)
            lab, name, client, top = None, cloud.bucket, cloud.client, prefix
            dataset = plan_dataset(n, file_bytes, prefix=top, seed=seed, shard_bytes=shard_bytes)
            dataset.upload(client.bucket(name))
            label, where = region_label(course), f"in gs://{name} (delete {top}/ afterwards)"
        shard_names = list(dataset.shards)
        per = sorted({len(m) for m in dataset.shards.values()})
        return Layouts(client, name, f"{dataset.prefix}/files/", list(dataset.sizes), name,
                       f"{dataset.prefix}/shards/", shard_names, dict(dataset.sizes), True, label,
                       f"{n} files of {file_bytes / 2**10:g} KiB and {len(shard_names)} shards of "
                       f"{' or '.join(map(str, per))} samples, {where}", dataset.content, lab, profile)
    cloud, large = course.cloud_data(), course.cloud_data(dataset="landsat-scene")
    rng = random.Random(seed)
    images = {b.name[len(cloud.prefix):]: b.size for b in cloud.client.list_blobs(cloud.bucket, prefix=cloud.prefix)
              if b.name.endswith(cloud.suffix)}
    keys = sorted(rng.sample(sorted(images), min(n, len(images))))
    bands = {b.name: b.size for b in cloud.client.list_blobs(large.bucket, prefix=large.prefix)
             if b.name.endswith(large.suffix)}
    chosen = sorted(rng.sample(sorted(bands, key=lambda b: bands[b])[:-1], min(large_files, len(bands) - 1)))
    return Layouts(cloud.client, cloud.bucket, cloud.prefix, keys, large.bucket, large.prefix, chosen,
                   {**{k: images[k] for k in keys}, **{b: bands[b] for b in chosen}}, False, region_label(course),
                   f"{len(keys)} images of {cloud.uri} ({cloud.location}) and {len(chosen)} Landsat bands of "
                   f"{large.uri} ({large.location})", locations=(cloud.location, large.location))


def read_shard(data: bytes) -> dict[str, bytes]:
    """Every file of a tar shard, by its member name (the sample's key and suffix)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def measure_layouts(layouts: Layouts, parallel: int, repeats: int, seed: int = 0) -> Any:
    """Each repetition lists both layouts and reads every sample four ways into memory (files one by one, files
    ``parallel`` at a time, the large objects one by one, and ``parallel`` at a time), in a shuffled
    order; every result checked against what the bucket holds, outside the clock. Rows: ``how``, ``kind``
    (list or read), ``seconds``, ``requests`` (answered by the lab's server, else issued), ``objects``,
    ``bytes``, ``MBps``."""
    from dataferry.harness.bench import interleave

    lay, client = layouts, layouts.client
    bucket, large_bucket = client.bucket(lay.bucket), client.bucket(lay.large_bucket)
    pattern = re.compile(rf"/b/({re.escape(lay.bucket)}|{re.escape(lay.large_bucket)})(/|\?|$)")

    def served() -> int:
        return sum(1 for _, path, _ in lay.lab.requests() if pattern.search(path))

    def one_large(name: str) -> dict[str, bytes]:
        data = large_bucket.blob(name).download_as_bytes()
        return read_shard(data) if lay.shards else {name: data}

    def in_parallel(names: list[str]) -> dict[str, bytes]:
        with ThreadPoolExecutor(min(parallel, len(names))) as pool:
            return {k: v for part in pool.map(one_large, names) for k, v in part.items()}

    def files_in_parallel(_: Path) -> dict[str, bytes]:  # as the shards are read: into memory, many at once
        with ThreadPoolExecutor(min(parallel, len(lay.keys))) as pool:
            blobs = pool.map(lambda k: bucket.blob(lay.small_prefix + k).download_as_bytes(), lay.keys)
            return dict(zip(lay.keys, blobs))

    read_keys = lay.keys if lay.shards else lay.large
    readers: dict[str, tuple[Callable[[Path], Any], int, list[str]]] = {
        "files, one by one": (lambda _: {k: bucket.blob(lay.small_prefix + k).download_as_bytes() for k in lay.keys},
                               len(lay.keys), lay.keys),
        f"files, {parallel} at a time": (files_in_parallel, len(lay.keys), lay.keys),
        f"{lay.large_name}, one by one": (lambda _: {k: v for n in lay.large for k, v in one_large(n).items()},
                                          len(lay.large), read_keys),
        f"{lay.large_name} in parallel": (lambda _: in_parallel(lay.large), len(lay.large), read_keys),
    }
    listings = {lay.small_name: (lay.bucket, lay.small_prefix), lay.large_name: (lay.large_bucket, lay.large_prefix)}

    def counted(fn: Callable[[], Any], issued: Callable[[Any], int]) -> tuple[float, Any, int]:
        before = served() if lay.lab is not None else 0
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        if lay.lab is None:
            return seconds, result, issued(result)
        return seconds, result, served() - before  # requests() lets the server's log catch up

    def check(samples: dict[str, bytes], names: list[str]) -> None:
        if samples.keys() != set(names):
            raise AssertionError(f"read {len(samples)} samples, expected {len(names)}")
        bad = [k for k in names if (samples[k] != lay.contents(k) if lay.contents else len(samples[k]) != lay.sizes[k])]
        if bad:
            raise AssertionError(f"{len(bad)} samples differ from what the bucket holds, e.g. {bad[0]}")

    def listing(where: tuple[str, str]) -> Callable[[Any], dict[str, Any]]:
        def run(turn: Any) -> dict[str, Any]:
            seconds, blobs, requests = counted(lambda: list(client.list_blobs(where[0], prefix=where[1])),
                                               lambda b: max(1, -(-len(b) // 1000)))
            return {"kind": "list", "seconds": seconds, "requests": requests, "objects": len(blobs), "bytes": 0}
        return run

    def reading(fn: Callable[[Path], Any], issued: int, names: list[str]) -> Callable[[Any], dict[str, Any]]:
        def run(turn: Any) -> dict[str, Any]:
            seconds, samples, requests = counted(lambda: fn(Path(turn.folder)), lambda _: issued)
            check(samples, names)
            return {"kind": "read", "seconds": seconds, "requests": requests, "objects": len(samples),
                    "bytes": sum(map(len, samples.values()))}
        return run

    ways = {**{f"list {layout}": listing(where) for layout, where in listings.items()},
            **{how: reading(*reader) for how, reader in readers.items()}}
    with layouts.network(), tempfile.TemporaryDirectory(prefix="layouts-") as work:
        rows = interleave(ways, repeats, seed, work_dir=work).rename(columns={"way": "how"})
    rows["MBps"] = rows["bytes"] / rows["seconds"] / 1e6
    return rows
