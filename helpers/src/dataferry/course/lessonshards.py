"""Lesson 09's front door and runs: files to pack into shards wherever ``WHERE`` points, epochs streamed
through a cache smaller than the data, and the lab-only comparison with files and webdataset's cache."""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.course.lessondata import crossing, region_label

if TYPE_CHECKING:
    from dataferry.course.run import Course

__all__ = ["ShardFiles", "shard_files", "stream_epochs", "compare_readers", "webdataset_cleanup_s"]


@dataclass
class ShardFiles:
    """Files to pack (``source``, ``names`` or every one listed), where the shards go (``shards_at``: a
    ``gs://`` address, or a local folder when the bucket cannot be written), and where it all runs."""

    source: Any
    names: list[str] | None
    shards_at: str
    client: Any
    label: str
    about: str
    work: Path
    lab: Any = field(default=None, repr=False)
    profile: str | None = None
    bucket: str = ""
    location: str = ""

    def network(self) -> contextlib.AbstractContextManager[str]:
        """The lab's profile inside the ``with`` (the old one back after); elsewhere the network as it is."""
        return crossing(self.lab, self.profile, self.label)

    def shard_source(self) -> Any:
        """The shards, once made, as a source to read them from."""
        from dataferry import GCSSource, LocalSource

        if not self.shards_at.startswith("gs://"):
            return LocalSource(self.shards_at)
        bucket, prefix = self.shards_at[5:].split("/", 1)
        return GCSSource(bucket, prefix, client=self.client)

    def __str__(self) -> str:
        return self.about


def shard_files(course: Course, n: int, size: int, shard_mb: float, *, seed: int = 0, bucket: str = "",
                prefix: str = "", dataset: str = "flowers", profile: str = "same-continent") -> ShardFiles:
    """``n`` files: in the lab ``size`` random bytes each in a fresh lab bucket (shards beside them, read under
    ``profile``); elsewhere a sample of the public data (shards on this runtime's disk: a public bucket cannot
    be written) or of your ``bucket``/``prefix`` (shards beside the files)."""
    from dataferry import GCSSource

    work = course.folder("", "shards")
    if course.where == "lab":
        from dataferry.course.lab import Lab, plan_dataset

        lab = Lab().up()
        name = f"l09-{seed}-{time.time_ns()}"
        plan_dataset(n, size, prefix="l09", seed=seed, shard_bytes=None).upload(lab.create_bucket(name))

        def remove() -> None:
            lab.set_profile("unshaped")
            lab.delete_bucket(name)

        course.on_finish(remove)
        return ShardFiles(GCSSource(name, "l09/files/", client=lab.client()), None,
                          f"gs://{name}/l09/shards-{shard_mb:g}mb", lab.client(), f"lab:{profile}",
                          f"{n} files of {size / 2**10:g} KiB in gs://{name}, read under the lab's {profile!r} profile "
                          "(lab numbers, not cloud numbers)", work, lab, profile, name, "lab (fake-gcs-server)")
    cloud = course.cloud_data(bucket, prefix, dataset=dataset)
    source = GCSSource(cloud.bucket, cloud.prefix, client=cloud.client)
    listed = sorted(e.name for e in source.list() if e.name.endswith(cloud.suffix))
    names = sorted(random.Random(seed).sample(listed, min(n, len(listed))))
    shards_at = (str(work / "shards") if cloud.anonymous
                 else f"gs://{cloud.bucket}/{cloud.prefix.rstrip('/')}-shards-{shard_mb:g}mb")
    return ShardFiles(source, names, shards_at, cloud.client, region_label(course), f"{len(names)} files drawn from the {len(listed)} of {cloud.uri}; shards go "
                      f"to {shards_at}", work, bucket=cloud.bucket, location=cloud.location)


def stream_epochs(ds: Any, cache: Any, epochs: int, batch_size: int, folder: Path, files: ShardFiles,
                  shards: int, shard_bytes: int) -> tuple[Any, Any]:
    """Every shard read once per epoch through ``ds`` (a ``ShardDataset`` over ``cache``), in a new seeded
    order, the kept shards dropped from the page cache before each epoch (checked with ``mincore``): per
    epoch the samples, seconds, megabytes and shards fetched, the shards kept after; and the cache's bytes
    on disk every 5 ms. Each epoch is a row of ``folder``'s ``results.csv``."""
    import pandas as pd

    from dataferry.harness.folders import sample_every
    from dataferry.harness.runtime import capture, detect_region
    from dataferry.shards import ShardLoader
    from dataferry.harness.results import Results
    from dataferry.harness.pagecache import evict

    region = detect_region(lab_profile=files.profile) if files.lab is not None else detect_region()
    runtime = capture(str(cache.root), region=region)
    meta = {"experiment": "shards under a cache budget", "runtime": runtime.to_dict(), "budget_bytes": cache.max_bytes,
            "shards": shards, "shard_bytes": shard_bytes, "source": files.shards_at, "bucket_location": files.location}
    rows, start = [], time.perf_counter()
    with sample_every(0.005, lambda: cache.usage()[1]) as on_disk, files.network(), Results(folder, meta) as results:
        for epoch in range(epochs):
            kept = [p for p in (Path(cache.root) / "objects").rglob("*") if p.is_file()]
            dropped = evict(kept) if kept else None
            loader = ShardLoader(ds, batch_size=batch_size)
            loader.set_epoch(epoch)
            before, t0 = cache.stats(), time.perf_counter()
            n = sum(len(batch["__key__"]) for batch in loader)
            seconds, did = time.perf_counter() - t0, cache.stats() - before
            rows.append({"epoch": epoch + 1, "samples": n, "seconds": round(seconds, 2),
                         "fetched MB": did.bytes_from_source / 1e6, "shards fetched": did.misses,
                         "kept after (shards)": cache.usage()[0], "ends at (s)": time.perf_counter() - start})
            results.add(method="shards-budget", region=region.region, region_source=region.source, runtime=runtime.kind,
                        file=f"({n} samples in {shards} shards)", file_bytes=shard_bytes // max(n, 1),
                        bytes=shard_bytes, samples=n, ns=int(seconds * 1e9), phase="stream", **{"pass": epoch + 1},
                        repeat=1, cache_state=dropped.cache_state if dropped else "cold_verified",
                        eviction=f"{did.misses} of {shards} shards fetched, budget {cache.max_bytes} B")
    return pd.DataFrame(rows), pd.DataFrame(on_disk, columns=["seconds", "bytes"])


def compare_readers(files: ShardFiles, budget: int, *, epochs: int, repeats: int, batch_size: int, shuffle: int,
                    seed: int, workers: int = 2) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]] | None:
    """Lab only (None, said, elsewhere): the same samples as shards, as files through the cache, and as shards
    through webdataset's cache (where installed), each run in a fresh process with an empty cache of
    ``budget``: every epoch of every run, and their summary (:func:`dataferry.course.lab.shardepochs.summarize`)."""
    import importlib.util

    if files.lab is None:
        print("This comparison runs in the offline lab, off Colab (`make bench-shards` in a clone of the repository): skipped here.")
        return None
    from dataferry.course.lab.shardepochs import METHODS, shard_epochs, summarize

    methods = [m for m in METHODS if m != "webdataset-cache" or importlib.util.find_spec("webdataset")]
    with files.network(), tempfile.TemporaryDirectory(prefix="compare-") as work:
        runs = shard_epochs(files.lab, files.bucket, "l09/files/", files.shard_source().prefix, Path(work),
                            budget=budget, epochs=epochs, methods=methods, workers=workers, batch=batch_size,
                            shuffle=shuffle, seed=seed, repeats=repeats, say=lambda line: None)
    return runs, summarize(runs, budget)


def webdataset_cleanup_s() -> float | None:
    """How often webdataset's ``FileCache`` cleans up to its size, by default (None without webdataset)."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("webdataset") is None:
        return None
    from webdataset.cache import FileCache

    return float(inspect.signature(FileCache).parameters["cache_cleanup_interval"].default)
