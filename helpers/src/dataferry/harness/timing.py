"""The timing harness: cache-state control, timed reads, and result files.

A "cold" read means the kernel's page cache holds none of the file. :func:`evict` drops a
set of files from the page cache (``posix_fadvise(DONTNEED)`` per file, no root needed, or
``drop_caches`` when writable) and checks with ``mincore`` that it worked, so a row can say
``cold_verified`` instead of hoping. :func:`timed_read` times the same spans for every method,
and :class:`Results` appends rows to CSV as they are measured. See MEASUREMENT.md.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import ctypes.util
import json
import mmap
import os
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataferry.errors import BadArgument, MissingPath

__all__ = ["evict", "resident_fraction", "residency_state", "EvictionReport", "drop_caches", "timed_read", "Spans",
           "Results", "time_h2d",
           "load_results", "size_text", "COLUMNS", "CACHE_STATES", "SCHEMA_VERSION"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def size_text(n: float) -> str:
    """A size in the binary unit data sets are made in: 262144 -> "256 KiB", 2**21 -> "2 MiB"."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{n:.0f} B"


def resident_fraction(path: str | os.PathLike[str]) -> float:
    """Share of the file's pages in the page cache (``mincore``); 0.0 for an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0.0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == _MAP_FAILED or addr is None:
            raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            return sum(v & 1 for v in vec) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


@dataclass
class EvictionReport:
    """What :func:`evict` did: files, how, and how many still had pages resident afterwards."""

    files: int
    method: str
    still_resident: int

    @property
    def verified(self) -> bool:
        return self.still_resident == 0

    @property
    def cache_state(self) -> str:
        return "cold_verified" if self.verified else "cold_unverified"


def drop_caches(level: int = 1) -> bool:
    """``sync; echo LEVEL > /proc/sys/vm/drop_caches`` (1: page cache, 2: dentries and inodes,
    3: both). Returns False, doing nothing, where that file is not writable (not root, a container)."""
    if level not in (1, 2, 3) or not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(str(level))
    except OSError:
        return False
    return True


def evict(paths: Iterable[str | os.PathLike[str]], verify: bool = True, global_level: int | None = None) -> EvictionReport:
    """Drop ``paths`` from the page cache and check with mincore which still have pages resident.

    Per file with ``posix_fadvise(DONTNEED)``; with ``global_level`` also through drop_caches
    when it is writable (e.g. 3 for a fully cold start: metadata too). Works on local files and
    FUSE mounts; it does not reach gcsfuse's own file cache (remount with an empty cache dir)."""
    paths = list(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # dirty pages cannot be dropped; read-only mounts refuse
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    method = "posix_fadvise(DONTNEED) per file"
    if global_level is not None and drop_caches(global_level):
        method += f" + drop_caches={global_level}"
    resident = sum(1 for p in paths if resident_fraction(p) > 0) if verify else len(paths)
    return EvictionReport(len(paths), method, resident)


# -- timed reads and result rows ---------------------------------------------------------------

SCHEMA_VERSION = 3
#: Versions :func:`load_results` reads; version 1 rows had no ``bucket_location`` (read as ""), versions
#: 1 and 2 no accelerator-utilisation columns (read as empty).
_READABLE_VERSIONS = (1, 2, 3)

#: One row per timed operation (long format). Units are in the names: ``*_ns`` nanoseconds,
#: ``bytes``, ``MBps`` = 10^6 bytes/s. ``pass`` 1 is the first read; ``phase`` says what was
#: timed: ``read`` (open..close of one file), ``download`` (an API download), ``stage`` (a
#: parallel copy into the cache), ``list`` (metadata listing), ``epoch`` (a whole pass: the
#: per-epoch aggregate sum(bytes) / wall time, including any download or staging it needed), ``train``
#: (a training epoch through :func:`dataferry.harness.feed.feed`: ``au`` = accelerator busy / wall time, ``samples``,
#: the per-step data wait's median and 95th percentile, which of loader or compute ``bound_by`` most
#: steps, and the ``compute_profile`` that set the compute time).
COLUMNS = [
    "run_id", "time_utc", "method", "region", "region_source", "bucket_location", "runtime", "file", "file_bytes",
    "bytes",
    "pass", "repeat", "cache_state", "eviction", "concurrency", "phase",
    "open_ns", "first_byte_ns", "read_ns", "close_ns", "ns", "MBps", "retries", "error",
    "au", "samples", "wait_p50_ns", "wait_p95_ns", "bound_by", "compute_profile",
]
CACHE_STATES = ("cold_verified", "cold_unverified", "page_warm", "daemon_warm", "local_copy")
CHUNK = 1 << 20


@dataclass
class Spans:
    """The same spans for every method: open, first byte, whole read, close (``perf_counter_ns``).
    ``read_ns`` runs from the end of open to the last byte, so it includes ``first_byte_ns``."""

    bytes: int
    open_ns: int
    first_byte_ns: int
    read_ns: int
    close_ns: int

    @property
    def ns(self) -> int:
        return self.open_ns + self.read_ns + self.close_ns

    @property
    def MBps(self) -> float:
        return self.bytes / self.ns * 1e3 if self.ns else float("nan")


def timed_read(path: str | os.PathLike[str], chunk: int = CHUNK) -> Spans:
    """Read a whole file (local, Drive or gcsfuse mount) and time its spans; bytes are what the
    reads returned."""
    t0 = time.perf_counter_ns()
    fd = os.open(path, os.O_RDONLY)
    t1 = time.perf_counter_ns()
    try:
        n = len(os.read(fd, chunk))
        t2 = time.perf_counter_ns()
        while data := os.read(fd, chunk):
            n += len(data)
        t3 = time.perf_counter_ns()
    finally:
        os.close(fd)
    t4 = time.perf_counter_ns()
    return Spans(n, t1 - t0, t2 - t1, t3 - t1, t4 - t3)


class Results:
    """Rows appended to ``results.csv`` as they are measured, with ``run_meta.json`` beside them,
    so a disconnect loses nothing that was measured. Rows are dicts with :data:`COLUMNS`; a row's
    ``bucket_location`` defaults to the run's (``meta["bucket_location"]``), the far end of every read."""

    def __init__(self, folder: str | os.PathLike[str], meta: dict[str, Any] | None = None,
                 run_id: str | None = None) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise BadArgument(f"{self.folder}: a file is in the way; results go to a folder (results.csv, "
                              "run_meta.json): choose another") from None
        self.run_id = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"
        self.csv_path = self.folder / "results.csv"
        self.meta_path = self.folder / "run_meta.json"
        self.meta = {"schema_version": SCHEMA_VERSION, "run_id": self.run_id, "columns": COLUMNS,
                     "started_utc": _now(), "command": sys.argv, **(meta or {})}
        self.write_meta()
        new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        self._file = open(self.csv_path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="raise")
        if new:
            self._csv.writeheader()
            self._file.flush()
        self.count = 0

    def write_meta(self, **more: Any) -> None:
        """Update ``run_meta.json`` (atomically)."""
        self.meta.update(more)
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.meta, indent=1, default=str))
        os.replace(tmp, self.meta_path)

    def add(self, **values: Any) -> dict[str, Any]:
        """Append one row now (flushed to the OS at once). ``MBps`` follows from bytes and ns."""
        row: dict[str, Any] = {c: "" for c in COLUMNS}
        row.update(run_id=self.run_id, time_utc=_now(), retries=0, bucket_location=self.meta.get("bucket_location") or "")
        unknown = set(values) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown result columns: {sorted(unknown)}")
        row.update(values)
        if row["MBps"] == "" and row["ns"] not in ("", 0) and row["bytes"] != "" and not row["error"]:
            row["MBps"] = int(row["bytes"]) / int(row["ns"]) * 1e3
        self._csv.writerow(row)
        self._file.flush()
        self.count += 1
        return row

    def close(self) -> None:
        self.write_meta(finished_utc=_now(), rows=self.count)
        self._file.close()

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Results {self.run_id}: {self.count} rows in {self.csv_path}>"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_results(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str], run_id: str | None = None):
    """Merge result files into one DataFrame: each path is a ``results.csv``, or a folder searched
    for them. Rows keep their ``run_id``; a run whose metadata has another schema version is refused.
    With ``run_id``, only that run's rows (a results file holds every run written to its folder)."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("results.csv"))
        elif p.is_file():
            files.append(p)
        else:
            raise MissingPath(2, f"{p}: no such file or folder; give results.csv files, or folders holding them")
    if not files:
        raise MissingPath(2, f"no results.csv under {', '.join(map(str, paths))}: give the --out folder of a bench run")
    frames = []
    for f in files:
        meta = f.with_name("run_meta.json")
        if meta.exists():
            version = json.loads(meta.read_text()).get("schema_version")
            if version not in _READABLE_VERSIONS:
                raise BadArgument(f"{f}: schema version {version}, this dataferry reads {_READABLE_VERSIONS}")
        try:
            frame = pd.read_csv(f, keep_default_na=False, dtype={"error": str, "file": str, "bucket_location": str,
                                                                 "bound_by": str, "compute_profile": str,
                                                                 "run_id": str})
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError):
            frame = None
        if frame is None or not {"run_id", "method", "phase"} <= set(frame.columns):
            raise BadArgument(f"{f} is not a dataferry results.csv (the file `dataferry bench` writes): check the path")
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True).reindex(columns=COLUMNS)  # older schemas lack some columns
    for col in ("bucket_location", "bound_by", "compute_profile"):
        rows[col] = rows[col].astype(object).fillna("")  # absent in older schemas: NaN floats
    for col in ("file_bytes", "bytes", "pass", "repeat", "concurrency", "open_ns", "first_byte_ns", "read_ns",
                "close_ns", "ns", "retries", "samples", "wait_p50_ns", "wait_p95_ns"):
        rows[col] = pd.to_numeric(rows[col], errors="coerce").astype("Int64")
    for col in ("MBps", "au"):
        rows[col] = pd.to_numeric(rows[col], errors="coerce")
    if run_id is None:
        return rows
    picked = rows[rows["run_id"] == str(run_id)].reset_index(drop=True)
    if picked.empty:
        raise BadArgument(f"no rows of run {run_id!r} in {', '.join(map(str, files))}; its runs: "
                          f"{', '.join(rows['run_id'].unique()[:5])}")
    return picked


def residency_state(paths: Iterable[str | os.PathLike[str]]) -> str:
    """The page-cache state of files about to be read: ``cold_verified`` (no page resident),
    ``page_warm`` (every file fully resident) or ``cold_unverified`` (anything in between)."""
    fractions = [resident_fraction(p) for p in paths]
    if all(f == 0 for f in fractions):
        return "cold_verified"
    return "page_warm" if all(f == 1 for f in fractions) else "cold_unverified"


def time_h2d(data: bytes, repeats: int = 10) -> list[dict[str, Any]] | str:
    """Host-to-device copies of one loaded batch, pageable and pinned, each timed between
    ``torch.cuda.synchronize()`` calls after a warm-up copy. Returns rows (``method``
    ``h2d-pageable`` / ``h2d-pinned``, ``phase`` ``h2d``), or a one-line note where there is no CUDA."""
    try:
        import torch
    except ImportError:
        return "GPU copies skipped: torch is not installed"
    if not torch.cuda.is_available():
        return "GPU copies skipped: no CUDA device here (torch.cuda.is_available() is False)"
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = []
    for method, tensor in (("h2d-pageable", host), ("h2d-pinned", host.pin_memory())):
        tensor.to("cuda", non_blocking=False)  # warm-up: context, allocator
        torch.cuda.synchronize()
        for repeat in range(1, repeats + 1):
            t0 = time.perf_counter_ns()
            tensor.to("cuda", non_blocking=method == "h2d-pinned")
            torch.cuda.synchronize()
            ns = time.perf_counter_ns() - t0
            rows.append({"method": method, "phase": "h2d", "file": f"({len(data)} B batch)", "bytes": len(data),
                         "file_bytes": len(data), "repeat": repeat, "pass": 1, "concurrency": 1, "ns": ns,
                         "cache_state": "page_warm", "eviction": torch.cuda.get_device_name(0)})
    return rows
