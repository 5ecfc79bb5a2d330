"""Lesson 02's front door: files in a bucket, mounted with gcsfuse or measured, whatever ``WHERE`` is.

    >>> files = lesson_files(course, 5, 1 << 20, profile="cross-continent")
    >>> with files.network(), files.mount(file_cache=True) as m:   # a fresh gcsfuse mount of the bucket
    ...     paths = [m.mountpoint / name for name in files.names]

In the lab the files are random bytes put in a lab bucket (and a plain local copy), mounted by the lab's own
gcsfuse; elsewhere they are a sample of the public data set (or your ``bucket``/``prefix``), mounted by the
gcsfuse Google's apt package installs. Either way the gcsfuse version is known and recorded with every row.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.course.lessondata import crossing, region_label

if TYPE_CHECKING:
    from dataferry.course.run import Course

__all__ = ["LessonFiles", "lesson_files", "large_files"]


@dataclass
class LessonFiles:
    """Objects of one bucket for a lesson: ``names`` (relative to a mount's root), the client that lists them,
    the ``label`` every figure of them carries, and the gcsfuse ``version`` that mounts them."""

    bucket: str
    names: list[str]
    client: Any
    label: str
    about: str
    gcsfuse_version: str
    lab: Any = field(default=None, repr=False)
    profile: str | None = None
    anonymous: bool = True
    target: Any = field(default=None, repr=False)
    cloud: Any = field(default=None, repr=False)

    @property
    def bytes(self) -> int:
        return sum(b.size for b in self.client.list_blobs(self.bucket) if b.name in set(self.names))

    def network(self) -> contextlib.AbstractContextManager[str]:
        """The lab's profile inside the ``with`` (the old one back after); elsewhere the network as it is."""
        return crossing(self.lab, self.profile, self.label)

    def mount(self, *, file_cache: bool = False, config: dict[str, Any] | None = None,
              extra_args: tuple[str, ...] = ()) -> Any:
        """A fresh gcsfuse mount of the bucket (a ``with`` block unmounts it, its file cache going with it)."""
        if self.lab is not None:
            return self.lab.mount(self.bucket, file_cache=file_cache, config=config, extra_args=extra_args)
        from dataferry.mounts import mount_gcsfuse

        return mount_gcsfuse(self.bucket, anonymous=self.anonymous, file_cache=file_cache, config=config,
                             extra_args=extra_args)

    def measure(self, methods: list[str], folder: Path, repeats: int, seed: int = 0) -> Any:
        """Every method's first read (pass 1) and re-read (pass 2) of these files, ``repeats`` times, into
        ``folder``'s ``results.csv``; the rows, with the gcsfuse version in the run's metadata."""
        meta = {"gcsfuse": {"version": self.gcsfuse_version}}
        if self.lab is not None:
            from dataferry.harness.bench import measure
            from dataferry.harness.runtime import detect_region

            with self.network():
                return measure(self.target, methods, folder, region=detect_region(lab_profile=self.profile),
                               passes=2, repeats=repeats, seed=seed, meta=meta)
        from dataferry.harness.bench import bench_source
        from dataferry.harness.results import load_results

        cloud = self.cloud
        run = bench_source(cloud.uri, out=folder, methods=methods, max_files=len(self.names), passes=2,
                           repeats=repeats, seed=seed, client=cloud.client, suffix=cloud.suffix,
                           meta={"bucket_location": cloud.location, **meta}, say=lambda line: None)
        return load_results(run["results"], run_id=run["run_id"])

    def __str__(self) -> str:
        return self.about


def _lab_gcsfuse(lab: Any) -> str:
    gcsfuse = lab.status()["gcsfuse"]
    if not gcsfuse["available"]:
        raise RuntimeError(f"this lesson needs gcsfuse, which this lab lacks: {gcsfuse['why']}")
    return str(gcsfuse.get("version") or "unknown")


def _installed_gcsfuse() -> str:
    """The version of the gcsfuse Google's apt package installs (in Colab), from ``gcsfuse --version``."""
    import re

    from dataferry.mounts import install_gcsfuse

    said = str(install_gcsfuse())
    found = re.search(r"version (\S+)", said)
    return found.group(1) if found else said


def lesson_files(course: Course, n: int, size: int, *, seed: int = 0, bucket: str = "", prefix: str = "",
                 project: str = "", profile: str = "cross-continent", gcsfuse: bool = True) -> LessonFiles:
    """``n`` files: in the lab of ``size`` random bytes in the bucket ``l<NN>-data``, read under ``profile``;
    elsewhere drawn at random (``seed``) from the public flowers or your ``bucket``/``prefix`` (in ``project``).
    ``gcsfuse``: the lesson mounts them (in Colab gcsfuse is installed first)."""
    if course.where == "lab":
        from dataferry.course.lab import Lab
        from dataferry.course.lab.methodsbench import lab_target

        lab = Lab().up()
        version = _lab_gcsfuse(lab) if gcsfuse else "not used"
        name = f"l{course.lesson[:2]}-data"
        target = lab_target(lab, name, n_files=n, file_bytes=size, seed=seed)
        names = [target.prefix + n for n in target.names]
        return LessonFiles(name, names, lab.client(), f"lab:{profile}", f"{n} files of {size / 2**20:g} MiB in "
                           f"gs://{name}, read under the lab's {profile!r} profile (lab numbers, not cloud numbers)"
                           + (f"; gcsfuse {version}" if gcsfuse else ""), version, lab, profile, target=target)
    version = _installed_gcsfuse() if gcsfuse else "not used"
    cloud = course.cloud_data(bucket, prefix, project)
    listed = [b.name for b in cloud.client.list_blobs(cloud.bucket, prefix=cloud.prefix or None)
              if not b.name.endswith("/") and b.name.endswith(cloud.suffix)]
    names = sorted(random.Random(seed).sample(listed, min(n, len(listed))))
    return LessonFiles(cloud.bucket, names, cloud.client, region_label(course), f"{len(names)} files drawn from the {len(listed)} of "
                       f"{cloud.uri} (bucket location {cloud.location}, {cloud.location_source})"
                       + (f"; gcsfuse {version}" if gcsfuse else ""), version, anonymous=cloud.anonymous, cloud=cloud)


def large_files(course: Course, n: int, mib: int, *, seed: int = 0, profile: str = "cross-continent") -> LessonFiles:
    """``n`` large files: in the lab ``mib`` MiB of random bytes each in the bucket ``l<NN>-knobs``; elsewhere
    the largest bands but one of a public Landsat scene."""
    if course.where == "lab":
        from dataferry.course.lab import Lab

        lab = Lab().up()
        version = _lab_gcsfuse(lab)
        name = f"l{course.lesson[:2]}-knobs-{seed}"
        bucket = lab.create_bucket(name)
        names = [f"knobs/big-{i}.bin" for i in range(n)]
        for blob_name in names:
            if not bucket.get_blob(blob_name):
                bucket.blob(blob_name).upload_from_string(random.Random(blob_name).randbytes(mib << 20))
        return LessonFiles(name, names, lab.client(), f"lab:{profile}", f"{n} files of {mib} MiB in gs://{name}",
                           version, lab, profile)
    version = _installed_gcsfuse()
    large = course.cloud_data(dataset="landsat-scene")
    bands = {b.name: b.size for b in large.client.list_blobs(large.bucket, prefix=large.prefix)
             if b.name.endswith(large.suffix)}
    names = sorted(bands, key=lambda b: bands[b])[-n - 1:-1]  # large, but not the largest band
    return LessonFiles(large.bucket, names, large.client, f"{region_label(course)}, Landsat bands",
                       f"{len(names)} Landsat bands of {large.uri}, {sum(bands[b] for b in names) / len(names) / 2**20:.0f} "
                       "MiB each on average", version, cloud=large)
