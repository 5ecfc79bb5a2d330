"""Reading a folder the way the lessons measure it: listing it, reading every file in it, and copying an
archive of it to local disk and extracting it. Each returns what it did and how long it took, so a lesson
times the same spans as every other (``timing`` owns the single-file spans and the results files).

Works on any folder: local disk, a Drive mount, a gcsfuse mount.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataferry.errors import BadArgument
from dataferry.harness.pagecache import evict
from dataferry.harness.timing import timed_read

__all__ = ["LISTINGS", "ReadPass", "copy_extract_read", "extract", "read_files", "sample_every", "timed_listing",
           "walk"]


def walk(folder: str | os.PathLike[str]) -> list[str]:
    """Every file under ``folder``, depth first (os.scandir: one call per folder, no stat per file)."""
    found, stack = [], [os.fspath(folder)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for d in it:
                (stack.append(d.path) if d.is_dir(follow_symlinks=False) else found.append(d.path))
    return found


def _scandir(folder: str) -> int:
    with os.scandir(folder) as entries:
        return sum(1 for e in entries if e.is_file())


def _listdir_stat(folder: str) -> int:
    return sum(1 for name in os.listdir(folder) if stat.S_ISREG(os.stat(os.path.join(folder, name)).st_mode))


#: Two ways to count a folder's files: names and types from the directory read itself (``d_type``), or
#: names first and then one ``stat`` per name (one more file-system call per file, a round trip on a mount).
LISTINGS: dict[str, Callable[[str], int]] = {"os.scandir": _scandir, "os.listdir + os.stat": _listdir_stat}


def timed_listing(folder: str | os.PathLike[str], way: str = "os.scandir") -> tuple[int, int]:
    """List ``folder`` one of the :data:`LISTINGS` ways: (files found, nanoseconds it took)."""
    if way not in LISTINGS:
        raise BadArgument(f"no listing way {way!r}; choose from {', '.join(LISTINGS)}")
    t0 = time.perf_counter_ns()
    n = LISTINGS[way](os.fspath(folder))
    return n, time.perf_counter_ns() - t0


@dataclass(frozen=True)
class ReadPass:
    """One pass over files: how many, the bytes the reads returned, and the wall time of the whole pass."""

    files: int
    bytes: int
    seconds: float

    @property
    def MBps(self) -> float:  # noqa: N802 - the unit, as the results files name it
        return self.bytes / self.seconds / 1e6 if self.seconds else float("nan")

    def __repr__(self) -> str:
        return f"ReadPass({self.files} files, {self.bytes / 1e6:.1f} MB, {self.seconds:.3f} s, {self.MBps:.1f} MB/s)"


def read_files(paths: Iterable[str | os.PathLike[str]], width: int = 1) -> ReadPass:
    """Read every file whole, ``width`` at a time (threads; 1 reads them in order), timing the pass."""
    if width < 1:
        raise BadArgument(f"width must be at least 1, not {width}")
    paths = list(paths)
    t0 = time.perf_counter()
    if width == 1:
        n = sum(timed_read(p).bytes for p in paths)
    else:
        with ThreadPoolExecutor(width) as pool:
            n = sum(s.bytes for s in pool.map(timed_read, paths))
    return ReadPass(len(paths), n, time.perf_counter() - t0)


def _check_archive(archive: str | os.PathLike[str]) -> None:
    if not Path(archive).is_file():
        raise BadArgument(f"{archive}: no such archive; give the path of a .zip or .tar file")


def extract(archive: str | os.PathLike[str], into: str | os.PathLike[str]) -> list[Path]:
    """Unpack a ``.zip`` or a tar into ``into``; return the files it held. A member that would land
    outside ``into`` (``../``, an absolute path, a link out) is refused, as tarfile's ``data`` filter does."""
    into, name = Path(into), str(archive)
    _check_archive(archive)

    def inside(member: str) -> None:
        if not (into / member).resolve().is_relative_to(into.resolve()):
            raise BadArgument(f"{archive}: member {member!r} would land outside {into}; not extracted")

    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                inside(member)
            z.extractall(into)
    elif name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                inside(m.name)
                if m.issym() or m.islnk():
                    inside(os.path.join(os.path.dirname(m.name), m.linkname) if m.issym() else m.linkname)
                if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                    raise BadArgument(f"{archive}: member {m.name!r} is not a file or a folder; not extracted")
            if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+, 3.12+: its checks too
                t.extractall(into, filter="data")
            else:  # every member was checked above
                t.extractall(into)
    else:
        raise BadArgument(f"{archive}: not a .zip or a tar archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)")
    return [Path(p) for p in walk(into)]


def copy_extract_read(archive: str | os.PathLike[str], work: str | os.PathLike[str], width: int = 16) -> dict[str, Any]:
    """Copy one archive to ``work`` (local disk), extract it there, then read every file from the disk.

    The extracted files are evicted from the page cache between extracting and reading, outside the clock,
    so the read step reads the disk, as a later epoch would. Returns each step's seconds (``seconds``: all
    three, less the eviction), ``local_bytes`` (archive and files, the peak disk use), ``copy_bytes`` and
    the read's ``read_cache_state``."""
    work = Path(work)
    _check_archive(archive)
    if not work.is_dir():
        raise BadArgument(f"{work}: not a folder; copy_extract_read copies the archive into an existing folder")
    if Path(archive).resolve().parent == work.resolve():
        raise BadArgument(f"{archive} is already in {work}: give a work folder of its own")
    t0 = time.perf_counter()
    local = Path(shutil.copy(archive, work / Path(archive).name))
    t1 = time.perf_counter()
    files = extract(local, work / "data")
    t2 = time.perf_counter()
    size = local.stat().st_size
    peak = size + sum(f.stat().st_size for f in files)
    evicted = evict(files)
    t3 = time.perf_counter()
    read_files(files, width)
    t4 = time.perf_counter()
    return {"copy_s": t1 - t0, "extract_s": t2 - t1, "read_s": t4 - t3, "seconds": (t2 - t0) + (t4 - t3),
            "local_bytes": peak, "copy_bytes": size, "read_cache_state": evicted.cache_state}


@contextmanager
def sample_every(seconds: float, measure: Callable[[], float]) -> Iterator[list[tuple[float, float]]]:
    """Call ``measure`` every ``seconds`` on a thread while the block runs: a list of (seconds since the
    start, value), filled as it goes and complete when the block ends (e.g. a cache's bytes on disk)."""
    if not seconds > 0:
        raise BadArgument(f"sample every {seconds!r} seconds? give a positive interval")
    samples: list[tuple[float, float]] = []
    stop, start = threading.Event(), time.perf_counter()

    def run() -> None:
        while True:
            samples.append((time.perf_counter() - start, measure()))
            if stop.wait(seconds):
                return

    thread = threading.Thread(target=run, name="dataferry-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        samples.append((time.perf_counter() - start, measure()))
