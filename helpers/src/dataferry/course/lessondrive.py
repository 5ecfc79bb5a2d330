"""Lesson 01's front door: Google Drive in Colab, or a stand-in that says it is one.

    >>> drive = drive_files(course, 16, 1 << 20, listing=2000, profile="same-continent")
    >>> with drive.network(), drive.mount() as root:     # Drive's folder, or a fresh mount of the stand-in
    ...     n, ns = timed_listing(root / drive.listing)

In Colab, Drive is mounted (Google asks for access) and a sample is copied into ``MyDrive/dataferry/l01-sample``
once: files drawn from the public flowers (or your bucket) and a folder of small files to list. Later runtimes
find it there, so their first read is a first read. Where access is refused, and off Colab, a stand-in takes
Drive's place and says so in every label: in the lab a lab bucket mounted by the lab's gcsfuse with its file
cache, under a region profile; elsewhere the public flowers through gcsfuse with its file cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.errors import BadArgument
from dataferry.course.lessondata import crossing, region_label

if TYPE_CHECKING:
    import pandas as pd

    from dataferry.course.run import Course
    from dataferry.course.lessonfiles import LessonFiles

__all__ = ["DRIVE_MOUNT", "SAMPLE", "DriveFiles", "drive_files"]

#: Where Colab mounts Drive, and where under ``MyDrive`` the lesson keeps its sample.
DRIVE_MOUNT = "/content/drive"
SAMPLE = "dataferry/l01-sample"
LISTING_FILE_BYTES = 1024


@dataclass
class DriveFiles:
    """What lesson 01 reads as Drive. ``names`` and ``listing`` are relative to :meth:`mount`'s folder.

    ``folder`` is the Drive folder when Drive itself is measured (None: a stand-in); ``fresh`` says whether
    nothing in this runtime wrote or read those files before, so that a first read is a first read."""

    label: str
    about: str
    names: list[str]
    listing: str
    region: Any
    folder: Path | None = None
    fresh: bool = True
    files: LessonFiles | None = field(default=None, repr=False)
    why_not_drive: str = ""
    first_listing_ns: int | None = None  # Drive: the listing timed before anything else in this runtime listed it
    archive_folder: Path | None = None  # Drive: where the archives go (never inside your data)

    @property
    def is_drive(self) -> bool:
        return self.folder is not None

    @property
    def in_lab(self) -> bool:
        return self.files is not None and self.files.lab is not None

    @property
    def cap_MBps(self) -> float | None:  # noqa: N802 - the unit, as the results name it
        """The lab profile's bandwidth per connection (None outside the lab, or unshaped)."""
        if not self.in_lab:
            return None
        from dataferry.course.lab import PROFILES

        return PROFILES[self.files.profile or "unshaped"].bandwidth_MBps  # type: ignore[union-attr]

    @property
    def said(self) -> str:
        """The label and, for a stand-in, that it is one: what a conclusion is headed with."""
        return self.label if self.is_drive else f"{self.label}; a stand-in for Drive, not Drive"

    def network(self) -> contextlib.AbstractContextManager[str]:
        """The lab's profile inside the ``with``; elsewhere the network as it is."""
        if self.files is None:
            return crossing(None, None, self.label)
        return self.files.network()

    @contextlib.contextmanager
    def mount(self) -> Iterator[Path]:
        """The folder the names are in: Drive's, or a fresh gcsfuse mount of the stand-in with an empty file cache
        (gone at the end of the ``with``)."""
        if self.folder is not None:
            yield self.folder
            return
        assert self.files is not None
        with self.files.mount(file_cache=True) as m:
            yield Path(m.mountpoint)

    def listings(self, out: Path, repeats: int, seed: int = 0) -> pd.DataFrame:
        """Both ways of :data:`~dataferry.harness.folders.LISTINGS`, interleaved: on a stand-in each repetition lists on a
        fresh mount (pass 1) and again (pass 2); Drive cannot be made cold from a runtime, so its first listing
        was timed when it was found (only when this runtime had not listed it before) and the ways are compared on
        listings again. Rows go to ``out`` and come back with ``ms``."""
        from dataferry.harness.bench import interleave
        from dataferry.harness.folders import LISTINGS, timed_listing
        from dataferry.harness.runtime import capture
        from dataferry.harness.results import Results, load_results

        common = {"region": self.region.region, "region_source": self.region.source, "phase": "list",
                  "concurrency": 1, "bytes": 0, "runtime": capture(region=self.region).kind}
        with Results(out, {"experiment": "listing a big folder", "where": self.said, "seed": seed,
                           "repeats": repeats}) as results:
            def listed(way: str, root: Path, repeat: int, pass_no: int, state: str, how: str) -> None:
                n, ns = timed_listing(root / self.listing, way)
                results.add(**common, method=way, file=f"({n} entries)", ns=ns, repeat=repeat, cache_state=state,
                            eviction=how, **{"pass": pass_no})

            def fresh_mount(turn: Any) -> None:
                with self.mount() as root:
                    listed(turn.way, root, turn.repeat, 1, "cold_unverified", "a fresh mount")
                    listed(turn.way, root, turn.repeat, 2, "daemon_warm", "none: listed just before")

            def again(turn: Any) -> None:
                assert self.folder is not None
                listed(turn.way, self.folder, turn.repeat, 2, "daemon_warm", "listed before in this runtime")

            with self.network():
                if self.folder is not None and self.first_listing_ns is not None:  # timed when Drive was found
                    entries = len(os.listdir(self.folder / self.listing))
                    results.add(**common, method="os.scandir", file=f"({entries} entries)", ns=self.first_listing_ns, repeat=0,
                                cache_state="cold_unverified", eviction="first listing in this runtime", **{"pass": 1})
                interleave(dict.fromkeys(LISTINGS, again if self.folder is not None else fresh_mount), repeats, seed)
        rows = load_results(results.csv_path, run_id=results.run_id)
        return rows.assign(ms=rows["ns"].astype(float) / 1e6)

    def reads(self, out: Path, repeats: int, seed: int = 0) -> pd.DataFrame:
        """First read and re-reads (after a verified eviction) of the files, as :func:`dataferry.harness.bench.measure`
        rows: on a stand-in, ``repeats`` fresh mounts of two passes; on Drive one first read and ``repeats``
        re-reads (returned as repetitions of pass 2), since what Drive keeps cannot be emptied from a runtime."""
        from dataferry.harness.bench import Target, measure

        meta = {"stand_in_for": "" if self.is_drive else "Google Drive (gcsfuse with its file cache; not Drive)",
                "where": self.said, "first_read_in_this_runtime": self.fresh}
        if self.folder is None:
            assert self.files is not None
            return self.files.measure(["gcsfuse-cache"], out, repeats, seed)
        sizes = {n: (self.folder / n).stat().st_size for n in self.names}
        target = Target(names=list(self.names), sizes=sizes, folder=self.folder)
        rows = measure(target, ["drive"], out, region=self.region, passes=1 + repeats, repeats=1, seed=seed, meta=meta)
        again = rows["pass"] >= 2  # results.csv keeps passes 2, 3 ...; here they are the re-read's repetitions
        return rows.assign(repeat=rows["repeat"].where(~again, rows["pass"] - 1), **{"pass": rows["pass"].clip(upper=2)})

    def archives(self, kinds: list[str], work: Path, repeats: int, seed: int = 0) -> pd.DataFrame:
        """Each of ``kinds`` (zip, tar) of the files, copied to ``work`` on local disk, extracted and read, against
        the files read through the mount 16 at a time (and, in the lab, ``dataferry.stage`` from the bucket).
        Empty where there is nowhere to put an archive (a public bucket): :attr:`no_archive` says why."""
        import pandas as pd

        from dataferry.harness.bench import interleave

        unknown = [k for k in kinds if k not in ("zip", "tar")]
        if unknown:
            raise BadArgument(f"archive kind {unknown[0]!r}: choose 'zip' or 'tar'")
        if self.no_archive:
            return pd.DataFrame()
        packed = self._packed(kinds, work)
        ways = {f"{kind}: copy + extract": self._copy_extract(name) for kind, name in packed.items()}
        ways["files through the mount"] = self._through_the_mount
        if self.in_lab:
            ways["dataferry stage"] = self._staged
        with self.network():
            return interleave(ways, repeats, seed, work_dir=work / "runs")

    @property
    def no_archive(self) -> str:
        """Why this run compares no archive ("" when it does)."""
        if self.is_drive or self.in_lab:
            return ""
        return ("The archive comparison needs somewhere to put an archive: on your Drive (Drive was not measured "
                "here) or in the lab; a public bucket cannot take one.")

    def _packed(self, kinds: list[str], work: Path) -> dict[str, str]:
        """Pack the files into each kind of archive once (stored: images are compressed already), beside them;
        the archives' names relative to the mount's folder."""
        digest = hashlib.sha256("\n".join(self.names).encode()).hexdigest()[:10]
        out = {}
        for kind in kinds:
            name = f"archives/data-{digest}.{kind}"
            if self.archive_folder is not None:
                name = str(self.archive_folder / Path(name).name)  # absolute: the mount's folder / it is itself
            out[kind] = name
            if self.folder is not None and Path(self.folder, name).is_file():
                continue
            if self.folder is None and self._blob(name).exists():
                continue
            path = work / "packed" / Path(name).name
            path.parent.mkdir(parents=True, exist_ok=True)
            with self.mount() as root:
                if kind == "zip":
                    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
                        for n in self.names:
                            z.write(root / n, n)
                else:
                    with tarfile.open(path, "w") as t:
                        for n in self.names:
                            t.add(root / n, n)
            if self.folder is not None:
                Path(self.folder, name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(self.folder, name))
                self.fresh = False
            else:
                self._blob(name).upload_from_filename(path)
        return out

    def _blob(self, name: str) -> Any:
        assert self.files is not None and self.files.lab is not None
        return self.files.lab.client(direct=True).bucket(self.files.bucket).blob(name)

    def _copy_extract(self, name: str) -> Any:
        from dataferry.harness.folders import copy_extract_read
        from dataferry.harness.pagecache import drop_caches, evict

        def run(turn: Any) -> dict[str, Any]:
            drop_caches(1)
            with self.mount() as root:
                evict([root / name])  # the page cache's copy of the archive, wherever drop_caches cannot run
                return copy_extract_read(root / name, turn.folder)
        return run

    def _through_the_mount(self, turn: Any) -> dict[str, Any]:
        from dataferry.harness.folders import read_files
        from dataferry.harness.pagecache import drop_caches, evict

        drop_caches(1)
        with self.mount() as root:
            evict([root / n for n in self.names])  # outside the clock, as every measurement evicts
            t0 = time.perf_counter()
            got = read_files([root / n for n in self.names], 16)
            return {"seconds": time.perf_counter() - t0, "local_bytes": got.bytes}

    def _staged(self, turn: Any) -> dict[str, Any]:
        """``dataferry.stage`` from the stand-in's bucket, then every file read from the cache on disk."""
        from dataferry import Cache, GCSSource, stage
        from dataferry.harness.pagecache import drop_caches, evict

        assert self.files is not None and self.files.target is not None
        drop_caches(1)
        t0 = time.perf_counter()
        source, cache = GCSSource(self.files.bucket, self.files.target.prefix, client=self.files.client), \
            Cache(turn.folder / "cache")
        report = stage(source, cache, progress=False)
        t1 = time.perf_counter()
        evict([p for p in (turn.folder / "cache").rglob("*") if p.is_file()])  # read from disk, as the archive's
        t2 = time.perf_counter()
        sum(len(cache.read(source, e)) for e in source.list())
        return {"seconds": (t1 - t0) + (time.perf_counter() - t2), "local_bytes": report.bytes_total}

    def __str__(self) -> str:
        return self.about


def _runtime_marker(folder: Path) -> Path:
    """A file in this runtime's temporary folder (gone with the runtime) saying it wrote or read ``folder``."""
    return Path(tempfile.gettempdir()) / f"dataferry-drive-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"


def _copy_sample(course: Course, root: Path, n: int, listing: int, seed: int, bucket: str,
                 prefix: str) -> tuple[list[str], bool, int]:
    """The sample on Drive: ``n`` files drawn from the public flowers (or ``bucket``) and ``listing`` small files
    in one folder, each copied only when it is not there whole. Returns the names, whether anything was copied,
    and the nanoseconds its look at the small files' folder took (the first listing, when nothing listed it before)."""
    from dataferry.course.lessonfiles import lesson_files

    drawn = lesson_files(course, n, 0, seed=seed, bucket=bucket, prefix=prefix, gcsfuse=False)
    sizes = {b.name: b.size for b in drawn.client.list_blobs(drawn.bucket, prefix=drawn.cloud.prefix or None)
             if b.name in set(drawn.names)}
    copied = False
    for name in drawn.names:
        path = root / "files" / name
        if not (path.is_file() and path.stat().st_size == sizes[name]):
            path.parent.mkdir(parents=True, exist_ok=True)
            drawn.client.bucket(drawn.bucket).blob(name).download_to_filename(str(path))
            copied = True
    small = root / f"listing-{listing}"
    small.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter_ns()
    with os.scandir(small) as entries:  # the first listing of this folder in this runtime, when it is one
        have = {e.name for e in entries if e.is_file()}
    first_ns = time.perf_counter_ns() - t0
    rng = random.Random(seed)
    for i in range(listing):
        data = rng.randbytes(LISTING_FILE_BYTES)
        if f"f-{i:06d}.bin" not in have:
            (small / f"f-{i:06d}.bin").write_bytes(data)
            copied = True
    return [f"files/{name}" for name in drawn.names], copied, first_ns


def _your_folder(folder: Path, n: int, seed: int) -> tuple[list[str], str]:
    """``n`` files drawn from your Drive folder, and the folder in it holding the most files to list."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    if not files:
        raise BadArgument(f"DRIVE_FOLDER {folder} holds no files: give a folder of your data on the mounted Drive")
    counts: dict[str, int] = {}
    for name in files:
        counts[str(Path(name).parent)] = counts.get(str(Path(name).parent), 0) + 1
    return sorted(random.Random(seed).sample(files, min(n, len(files)))), max(counts, key=lambda k: counts[k])


def _on_drive(course: Course, n: int, listing: int, seed: int, folder: str, bucket: str, prefix: str,
              mountpoint: str) -> DriveFiles:
    from dataferry.mounts import MountError, mount_drive

    my_drive = mount_drive(mountpoint, readonly=False)  # Google asks; MountError when refused or silent
    where = course.region()
    if folder:
        root = Path(folder)
        if not root.is_dir():
            raise BadArgument(f"DRIVE_FOLDER {folder} is not a folder on the mounted Drive: check its path")
        marker = _runtime_marker(root)
        fresh = not marker.exists()
        names, listing_folder = _your_folder(root, n, seed)
        first_ns: int | None = None  # drawing the files walked the folder: no listing after it is a first one
        about = f"{len(names)} files drawn from your Drive folder {root} (walked to draw them: no first listing)"
    else:
        root = my_drive / SAMPLE
        marker = _runtime_marker(root)
        try:
            names, copied, listed_ns = _copy_sample(course, root, n, listing, seed, bucket, prefix)
        except OSError as e:  # a read-only mount kept from before, or Drive full
            raise MountError(f"the sample could not be written to {root} ({e}): run drive.mount('{mountpoint}', "
                             "force_remount=True) from google.colab, then this cell again") from None
        listing_folder = f"listing-{listing}"
        touched = marker.exists()
        fresh = not (copied or touched)
        first_ns = listed_ns if fresh else None
        about = (f"{len(names)} flower photos and a folder of {listing} small files on your Drive, in {root} "
                 + ("(copied there by this runtime: its first read may come from what Drive kept of the copy)"
                    if copied else "(this runtime has read them before)" if touched else
                    "(copied by an earlier runtime)"))
    marker.touch()
    return DriveFiles(f"Google Drive, {region_label(course)}", about, names, listing_folder, where, folder=root,
                      fresh=fresh, first_listing_ns=first_ns, archive_folder=my_drive / SAMPLE / "archives")


def _stand_in(course: Course, n: int, size: int, listing: int, seed: int, bucket: str, prefix: str,
              profile: str, why: str) -> DriveFiles:
    from dataferry.course.lessonfiles import lesson_files

    files = lesson_files(course, n, size, seed=seed, bucket=bucket, prefix=prefix, profile=profile)
    if files.lab is not None:
        from dataferry.course.lab import plan_dataset

        plan = plan_dataset(listing, LISTING_FILE_BYTES, prefix=f"listing-{listing}", depth=0, shard_bytes=None,
                            seed=seed)
        held = sum(1 for _ in files.client.list_blobs(files.bucket, prefix=f"{plan.prefix}/files/"))
        if held != listing:
            plan.upload(files.lab.client(direct=True).bucket(files.bucket), workers=16)
        listing_folder, region = f"{plan.prefix}/files", course.region(lab_profile=profile)
        what = "a lab bucket mounted by the lab's gcsfuse with its file cache"
    else:
        folders: dict[str, int] = {}
        for blob in files.client.list_blobs(files.bucket, prefix=files.cloud.prefix or None):
            folders[blob.name.rsplit("/", 1)[0]] = folders.get(blob.name.rsplit("/", 1)[0], 0) + 1
        listing_folder, region = max(folders, key=lambda f: folders[f]), course.region()
        what = f"{files.cloud.uri} mounted by gcsfuse with its file cache"
    about = (f"a stand-in for Drive, not Drive: {what}; {files.about}. Drive was not measured: {why}")
    return DriveFiles(files.label, about, files.names, listing_folder, region, files=files, why_not_drive=why)


def drive_files(course: Course, n: int, size: int, *, listing: int = 2000, folder: str = "", seed: int = 0,
                bucket: str = "", prefix: str = "", profile: str = "same-continent",
                mountpoint: str = DRIVE_MOUNT) -> DriveFiles:
    """Drive in Colab (``folder``: your own Drive folder instead of the sample), else a stand-in that says why:
    ``n`` files (of ``size`` bytes in the lab) and ``listing`` small files in one folder to list."""
    from dataferry.mounts import MountError, NotInColab

    if n < 1 or listing < 1:
        raise BadArgument(f"lesson 01 reads at least one file and lists at least one: n={n}, listing={listing}")
    if course.where == "lab":
        return _stand_in(course, n, size, listing, seed, bucket, prefix, profile,
                         "the lab runs offline, where Drive cannot be reached")
    try:
        return _on_drive(course, n, listing, seed, folder, bucket, prefix, mountpoint)
    except NotInColab:
        why = "Drive mounts only in Colab"
    except MountError as e:  # refused or silent (Colab's words, and what to do), or not writable (ours)
        why = (f"mounting it failed ({e.__cause__}); allow access when Google asks, and run the cell again"
               if e.__cause__ is not None else str(e))
    return _stand_in(course, n, size, listing, seed, bucket, prefix, profile, why)
