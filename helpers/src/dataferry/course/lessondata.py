"""One front door for a lesson's data: the same call whatever ``WHERE`` is.

    >>> data = course.images(200, seed=0, profile="colocated")
    >>> data.source, data.entries, data.label        # a GCSSource, its images in name order, "lab:colocated"
    >>> with data.network():                         # the lab's region profile; elsewhere the real network
    ...     ...

In the lab the images are the lab's drawn flowers, put into a fresh lab bucket (the lab starts if it is
not running); with ``public`` they are drawn from Google's public flower photos, read anonymously; with
``mine`` from your ``bucket``/``prefix``, with your credentials. A lesson never tests where it runs: what
differs lives here, and :meth:`LessonData.lab_only` says so when a lab-only demonstration cannot run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataferry.course.run import Course
    from dataferry.sources import Entry, GCSSource

__all__ = ["IMAGE_SUFFIXES", "BENCHMARK", "crossing", "region_label", "LessonData", "CheckpointPlaces", "LocalFiles", "MethodsRun", "Pooled",
           "images", "checkpoint_places", "local_files", "methods_run", "pooled_runs"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def region_label(course: Course) -> str:
    """``region <name>`` (a lab profile as ``lab:<profile>``), or that it was not found: what a figure of this run
    is labelled."""
    from dataferry.course.findings import where_said

    return where_said(course.region().region)


@contextlib.contextmanager
def crossing(lab: Any, profile: str | None, label: str) -> Iterator[str]:
    """The lab's ``profile`` inside the ``with`` (the old one back after); outside the lab, nothing changes."""
    if lab is None:
        yield label
        return
    chosen = profile or "unshaped"
    with lab.using_profile(chosen):
        yield f"lab:{chosen}"


@dataclass
class LessonData:
    """What a lesson reads: a source, the entries it reads from it, and one label for every figure of it.

    ``label`` is ``lab:<profile>`` in the lab (never a cloud number) and the bucket's ``gs://`` address
    elsewhere; ``about`` is one line for the lesson's output."""

    source: GCSSource
    entries: list[Entry]
    label: str
    about: str
    lab: Any = field(default=None, repr=False)
    profile: str | None = None
    test_source: Any = None
    test_names: set[str] | None = None

    def is_train(self, name: str) -> bool:
        """Whether ``name`` (relative to ``source``) is one of the images to train on."""
        return name in self._train

    def is_test(self, name: str) -> bool:
        """Whether ``name`` (relative to ``test_source``) is a held-out image to score on."""
        return self.test_names is None or name in self.test_names

    @property
    def _train(self) -> set[str]:
        return {e.name for e in self.entries}

    @property
    def bytes(self) -> int:
        """The entries' bytes, together."""
        return sum(e.size for e in self.entries)

    @property
    def in_lab(self) -> bool:
        return self.lab is not None

    @contextlib.contextmanager
    def network(self, profile: str | None = None) -> Iterator[str]:
        """Inside the ``with``, reads cross the lab's ``profile`` (this data's own by default), and the old one
        is put back after; outside the lab, the network is what it is. Yields the label of what was crossed."""
        with crossing(self.lab, profile or self.profile, self.label) as crossed:
            yield crossed

    def lab_only(self, what: str) -> bool:
        """Whether a lab-only demonstration (``what``) can run here; where it cannot, one line says so."""
        if self.lab is None:
            print(f"{what} needs the offline lab (WHERE = 'lab'): skipped here, on {self.label}.")
        return self.lab is not None

    def __str__(self) -> str:
        return self.about


def images(course: Course, n: int, *, seed: int = 0, bucket: str = "", prefix: str = "",
           profile: str = "colocated", held_out: int = 0) -> LessonData:
    """``n`` flower images of five classes (``<class>/<file>.jpg``) for ``course``'s lesson, wherever it runs,
    and ``held_out`` others to score a model on (``test_source``, ``is_test``).

    The lab draws ``n // 5`` per class into the bucket ``l<NN>-data`` and reads it under ``profile``;
    ``public`` and ``mine`` draw ``n`` of the bucket's images at random (``seed``) and read them as they are."""
    from dataferry.sources import GCSSource

    if n < 1:
        raise ValueError(f"n = {n}: a lesson reads at least one image")
    if course.where == "lab":
        from dataferry.course.lab import Lab
        from dataferry.course.lab.flowers import plan_flowers

        lab = Lab().up()
        name = f"l{course.lesson[:2]}-data"
        lab_bucket = lab.empty_bucket(name)
        flowers = plan_flowers(max(1, n // 5), seed=seed, prefix="train/").upload(lab_bucket)
        if held_out:
            plan_flowers(max(1, held_out // 5), seed=seed + 1, prefix="test/").upload(lab_bucket)
        source = GCSSource(name, "train/", client=lab.client())
        entries = sorted(source.list(), key=lambda e: e.name)
        test = GCSSource(name, "test/", client=lab.client()) if held_out else None
        return LessonData(source, entries, f"lab:{profile}", f"{flowers} in {source.uri}, read under the lab's "
                          f"{profile!r} profile (lab numbers, not cloud numbers)", lab, profile, test)
    cloud = course.cloud_data(bucket, prefix)
    source = GCSSource(cloud.bucket, cloud.prefix, client=cloud.client)
    listed = [e for e in source.list() if "/" in e.name and e.name.lower().endswith(IMAGE_SUFFIXES)]
    if not listed:
        raise ValueError(f"{source.uri} holds no <class>/<image> objects: set PREFIX to the folder of your classes")
    drawn = random.Random(seed).sample(listed, min(n + held_out, len(listed)))
    entries = sorted(drawn[:n], key=lambda e: e.name)
    return LessonData(source, entries, source.uri, f"{len(entries)} images drawn from the {len(listed)} of "
                      f"{source.uri} (bucket location {cloud.location}, {cloud.location_source})", None, None,
                      source if held_out else None, {e.name for e in drawn[n:]} if held_out else None)


@dataclass
class CheckpointPlaces:
    """Where lesson 10 saves checkpoints: ``folders`` (name -> folder) and ``buckets`` (name -> (``gs://``
    address, client)). In the lab the folder is a gcsfuse mount of a lab bucket (a Drive folder's stand-in:
    ``mounts`` holds it by name) and the same bucket is written through the API."""

    folders: dict[str, Path]
    buckets: dict[str, tuple[str, Any]]
    label: str
    lab: Any = field(default=None, repr=False)
    profile: str | None = None
    mounts: dict[str, Any] = field(default_factory=dict, repr=False)

    def network(self) -> contextlib.AbstractContextManager[str]:
        """The lab's profile (both ways: uploads too) inside the ``with``; elsewhere the network as it is."""
        return crossing(self.lab, self.profile, self.label)

    def close(self) -> None:
        """Unmount the lab's mounts and delete its bucket (nothing to do elsewhere)."""
        for mount in self.mounts.values():
            if mount.mounted:
                mount.unmount()
        if self.lab is not None:
            for uri, _ in self.buckets.values():
                self.lab.set_profile("unshaped")
                self.lab.delete_bucket(uri.removeprefix("gs://").split("/")[0])

    def __str__(self) -> str:
        places = [f"{name}: {folder}" for name, folder in self.folders.items()]
        places += [f"{name}: {uri}" for name, (uri, _) in self.buckets.items()]
        return f"checkpoints go to {'; '.join(places)} ({self.label})"


def checkpoint_places(course: Course, drive_folder: str = "", bucket: str = "", prefix: str = "",
                      profile: str = "same-continent") -> CheckpointPlaces:
    """Lesson 10's destinations: the lab's mounted bucket and the bucket itself; in Colab ``drive_folder`` and
    (``WHERE = "mine"``) ``bucket``/``prefix`` where given, else a folder on the runtime's own disk."""
    if course.where == "lab":
        import time

        from dataferry.course.lab import Lab

        lab = Lab().up()
        name = f"l10-ckpt-{time.time_ns()}"
        lab.create_bucket(name)
        mount = lab.mount(name)  # read-write, no file cache: the lab's stand-in for a Drive folder
        places = CheckpointPlaces({"mounted folder": mount.mountpoint / "ckpts"},
                                  {"bucket": (f"gs://{name}/ckpts", lab.client())}, f"lab:{profile}", lab, profile,
                                  {"mounted folder": mount})
        course.on_finish(places.close)
        return places
    folders: dict[str, Path] = {"Drive folder": Path(drive_folder)} if drive_folder else {}
    buckets: dict[str, tuple[str, Any]] = {}
    if course.where == "mine" and bucket:
        cloud = course.cloud_data(bucket, prefix)  # signs you in
        under = prefix.strip("/") + "/" if prefix.strip("/") else ""
        buckets["bucket"] = (f"gs://{bucket}/{under}dataferry-ckpts", cloud.client)
    if not folders and not buckets:
        folders["runtime's disk"] = course.folder("", "ckpts")  # the mechanism, on a disk a disconnect deletes
    return CheckpointPlaces(folders, buckets, region_label(course))


@dataclass
class LocalFiles:
    """Files of random bytes written to a disk (never to a folder in RAM, where nothing could be evicted)."""

    paths: list[str]
    filesystem: str
    mountpoint: str

    def __str__(self) -> str:
        total = sum(os.path.getsize(p) for p in self.paths)
        return (f"{len(self.paths)} files, {total / 1e6:.1f} MB, on the {self.filesystem} file system mounted at "
                f"{self.mountpoint}" + (": in RAM, so eviction cannot work" if self.filesystem in _IN_RAM else ""))


_IN_RAM = ("tmpfs", "ramfs")


def local_files(course: Course, n: int, size: int, given: str = "", seed: int = 0) -> LocalFiles:
    """``n`` files of ``size`` random bytes under ``given``, else under a temporary folder on a disk that
    :meth:`Course.finish` removes; each is synced, so its pages are clean and can be dropped."""
    from dataferry.host import mount_of

    folder = course.folder(given, "files")
    if not given and mount_of(folder)[1] in _IN_RAM:  # /tmp in RAM: a folder under home is on a disk
        folder = Path(tempfile.mkdtemp(prefix=f"{course.lesson[:2]}-files-", dir=Path.home()))
        course.on_finish(lambda: shutil.rmtree(folder, ignore_errors=True))
    folder.mkdir(parents=True, exist_ok=True)
    rng, paths = random.Random(seed), []
    for i in range(n):
        path = folder / f"sample-{i:03d}.bin"
        with open(path, "wb") as f:
            f.write(rng.randbytes(size))
            f.flush()
            os.fsync(f.fileno())
        paths.append(str(path))
    mountpoint, filesystem = mount_of(folder)
    return LocalFiles(paths, filesystem, str(mountpoint))


@dataclass
class MethodsRun:
    """One run of the methods benchmark (lessons 07 and 11): its rows, its folder, and where it read."""

    rows: Any
    folder: Path
    about: str
    lab: bool
    bucket_location: str | None = None

    def __str__(self) -> str:
        return self.about


def methods_run(course: Course, methods: list[str], n_files: int, repeats: int, *, seed: int = 0,
                profiles: tuple[str, ...] | list[str] = ("colocated", "cross-continent"), file_bytes: int = 1 << 20,
                bucket: str = "", prefix: str = "", dataset: str = "flowers", region: str = "") -> MethodsRun:
    """Every method reads the same files, first read and re-read, ``repeats`` times: in the lab under each of
    ``profiles`` (``n_files`` of ``file_bytes``, in a lab of its own), elsewhere from the public ``dataset`` or
    your ``bucket``/``prefix`` (a sample of ``n_files``), in whatever region this runtime is. Rows go to a
    new folder under the results' ``<NN>_by_region``, as they are measured."""
    import time

    from dataferry.harness.results import load_results

    folder = course.results_dir / f"{course.lesson[:2]}_by_region" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    if course.where == "lab":
        from dataferry.course.lab.methodsbench import bench_lab

        result = bench_lab(out=folder, json_path=folder / "methods.json", profiles=list(profiles), methods=methods,
                           n_files=n_files, file_bytes=file_bytes, repeats=repeats, passes=2, seed=seed,
                           say=lambda line: None)
        about = f"{n_files} files x {file_bytes / 2**20:g} MiB in the lab, under {', '.join('lab:' + p for p in profiles)}"
        return MethodsRun(load_results(folder, run_id=result["run_id"]), folder, about, True)
    from dataferry.harness.bench import bench_source

    cloud = course.cloud_data(bucket, prefix, dataset=dataset)
    if any(m.startswith("gcsfuse") for m in methods):
        from dataferry import mounts

        mounts.install_gcsfuse()  # Google's apt package, in Colab
    result = bench_source(cloud.uri, out=folder, json_path=folder / "methods.json", methods=methods,
                          max_files=n_files, passes=2, repeats=repeats, seed=seed, region=course.region(region),
                          client=cloud.client, suffix=cloud.suffix, meta={"bucket_location": cloud.location},
                          say=lambda line: None)
    about = f"up to {n_files} files of {cloud.uri} (bucket location {cloud.location}, {cloud.location_source})"
    return MethodsRun(load_results(folder, run_id=result["run_id"]), folder, about, False, cloud.location)


#: Lesson 07's benchmark: runs from real clouds are contributed from it, and the standard figures draw it.
BENCHMARK = "07_by_region"


@dataclass
class Pooled:
    """Every run pooled for lesson 11: all rows, the usable epoch rows with their setting, the training-loop
    rows, and the rows the standard figures draw (one lesson's runs of one file count)."""

    rows: Any
    epochs: Any
    train: Any
    figure_rows: Any
    train_drawn: Any
    about: str

    def __str__(self) -> str:
        return self.about


def failed_epochs(rows: Any) -> str:
    """How many epochs the pooled ``rows`` hold that failed (an error set), reading and training apart: the
    analysis leaves both out, and says so."""
    failed = rows[rows["error"] != ""]
    reads, trains = int((failed["phase"] == "epoch").sum()), int((failed["phase"] == "train").sum())
    return f"{reads} failed read epoch{'' if reads == 1 else 's'}, {trains} failed training epoch{'' if trains == 1 else 's'}"


def pooled_runs(course: Course, extra: list[str], shipped: bool, *, figure_lesson: str = "",
                **fallback: Any) -> Pooled:
    """Every ``results.csv`` under the course's results, ``extra`` folders and (``shipped``) the runs from real
    clouds that ship with the package, each row labelled with its lesson. With no epoch rows at all, a small
    :func:`methods_run` (``fallback``: its arguments) measures first, so the lesson has data."""
    import pandas as pd

    from dataferry.course.analysis import label_epochs, pool
    from dataferry.course.shipped import shipped_results

    folders = ([(course.results_dir, None)] + [(folder, None) for folder in extra]
               + ([(shipped_results(), BENCHMARK)] if shipped else []))
    rows = pool(folders, say=lambda line: None)
    epochs = label_epochs(rows) if rows is not None else None
    measured = ""
    if epochs is None or epochs.empty:
        methods, n_files, repeats = fallback.pop("methods"), fallback.pop("n_files"), fallback.pop("repeats")
        methods_run(course, methods, n_files, repeats, **fallback)
        measured = "No epoch rows were pooled yet, so a small comparison was measured first. "
        rows = pool(folders, say=lambda line: None)
        epochs = label_epochs(rows)
    lessons = epochs["lesson"].value_counts()
    drawn_lesson = figure_lesson or (BENCHMARK if BENCHMARK in lessons.index else lessons.index[0])
    if drawn_lesson not in lessons.index:
        raise ValueError(f"FIGURE_LESSON = {figure_lesson!r} has no epoch rows here; pooled: {', '.join(lessons.index)}")
    files = epochs[epochs["lesson"] == drawn_lesson]["files"].value_counts().index[0]
    drawn = epochs[(epochs["lesson"] == drawn_lesson) & (epochs["files"] == files)]
    n_shipped = len(list(shipped_results().rglob("results.csv"))) if shipped else 0
    about = (f"{measured}{len(rows)} rows from {rows['run_id'].nunique()} runs ({n_shipped} shipped from real clouds); "
             f"{len(epochs)} usable epoch rows; left out: {failed_epochs(rows)}. The standard figures draw "
             f"{drawn_lesson}'s runs of {files} files ({len(drawn)} epoch rows).")
    train = rows[(rows["phase"] == "train") & (rows["error"] == "")]
    train_drawn = train
    if not train.empty:  # the AU figure draws one setting, the most common; the table has every setting
        keys = ["lesson", "samples", "bytes", "runtime"]
        setting = train.groupby(keys).size().idxmax()
        train_drawn = train[(train[keys] == pd.Series(setting, index=keys)).all(axis=1)]
    return Pooled(rows, epochs, train, rows.loc[drawn.index], train_drawn, about)
