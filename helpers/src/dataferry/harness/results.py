"""Result files: rows appended to ``results.csv`` as they are measured, with ``run_meta.json`` beside them, and
read back into one DataFrame (:func:`load_results`) from any number of runs.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dataferry.errors import BadArgument, MissingPath

__all__ = ["Results", "load_results", "recorded_cache_states", "size_text", "COLUMNS", "SCHEMA_VERSION"]

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


def recorded_cache_states(rows: Any) -> Any:
    """The rows' ``cache_state`` column with empty cells (how a CSV loads a missing state) as missing, or None
    where no row recorded one (rows from before cache states were)."""
    if "cache_state" not in rows.columns:
        return None
    recorded = rows["cache_state"].mask(rows["cache_state"] == "")
    return None if recorded.isna().all() else recorded


def size_text(n: float) -> str:
    """A size in the binary unit data sets are made in: 262144 -> "256 KiB", 2**21 -> "2 MiB"."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{n:.0f} B"


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
