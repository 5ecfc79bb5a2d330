"""What may share a box: the rows a figure draws, classed by region and file size, and a record of
what each box holds.

A region and a file size make a *setting*; throughput from two settings is two different questions,
so no box, line or point of a standard figure ever pools them (nor rows of two lessons, when the
rows say which lesson they came from). Every box a figure draws is recorded with the regions, file
sizes and lessons of its rows; :func:`dataferry.harness.plots.save` writes that record into the PNG, and
:func:`box_provenance` reads it back, so a test can check any saved figure without redrawing it.
"""

from __future__ import annotations

import json
import math
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dataferry.harness.results import COLUMNS, size_text

PASS_KINDS = ("first read", "repeat")
LAB_NOTE = "lab: offline lab profile, not a cloud measurement"
#: The lab's region profiles, nearest first (their added round trips: 0, 2, 30 and 120 ms).
LAB_REGIONS_BY_DISTANCE = ("lab:unshaped", "lab:colocated", "lab:same-continent", "lab:cross-continent")
PROVENANCE_KEY = "dataferry:boxes"
UNKNOWN_SIZE = "size unknown"

_NEEDED = ("method", "region", "runtime", "pass", "phase", "MBps", "error")
_BOXES: weakref.WeakKeyDictionary[Figure, list[dict[str, Any]]] = weakref.WeakKeyDictionary()


def epochs_of(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Successful epoch rows with clean types, ``pass_kind``, ``size`` (a file-size class) and ``lesson``
    columns, plus footnotes on what was left out."""
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"rows must be a pandas DataFrame, not {type(rows).__name__}")
    missing = [c for c in _NEEDED if c not in rows.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing}; expected the long format of dataferry.harness.results.COLUMNS "
                         f"({len(COLUMNS)} columns)")
    epochs = rows[rows["phase"].astype("string").fillna("") == "epoch"]
    ok = epochs["error"].astype("string").fillna("").str.strip() == ""
    failed = int((~ok).sum())
    epochs = epochs[ok]
    mbps = pd.to_numeric(epochs["MBps"], errors="coerce").astype(float)
    passes = pd.to_numeric(epochs["pass"], errors="coerce").astype(float)
    usable = (mbps > 0) & np.isfinite(mbps) & (passes >= 1)
    unusable = int((~usable).sum())
    file_bytes = (pd.to_numeric(epochs["file_bytes"], errors="coerce") if "file_bytes" in epochs.columns
                  else pd.Series(np.nan, index=epochs.index)).astype(float)
    out = pd.DataFrame({
        "method": _labels(epochs["method"]),
        "region": _labels(epochs["region"]),
        "runtime": _labels(epochs["runtime"]),
        "pass": passes,
        "MBps": mbps,
        "size_class": file_bytes.map(_size_class),
        "lesson": epochs["lesson"].astype("string").fillna("").str.strip().astype(str)
        if "lesson" in epochs.columns else "",
    })[usable.to_numpy()]
    out["pass"] = out["pass"].astype(int)
    out["pass_kind"] = np.where(out["pass"] == 1, PASS_KINDS[0], PASS_KINDS[1])
    # A class holds sizes within a factor of 1.4 of a power of two: said "~" unless every file is exactly that size.
    exact = (file_bytes[usable] == out["size_class"].to_numpy()).groupby(out["size_class"].to_numpy()).all()
    out["size"] = [size_label(c, approximate=not exact.get(c, False)) for c in out["size_class"]]
    notes = []
    if (out["region"].str.startswith("lab:")).any():
        notes.append(LAB_NOTE)
    if failed:
        notes.append(f"left out: {failed} failed epoch row(s) (error set)")
    if unusable:
        notes.append(f"left out: {unusable} epoch row(s) without a positive MB/s or a pass number")
    return out.reset_index(drop=True), notes


def size_label(size_class: float, approximate: bool = False) -> str:
    """A file-size class in the binary unit files are made in: "256 KiB files", "~2 MiB files"."""
    if not np.isfinite(size_class) or size_class <= 0:
        return UNKNOWN_SIZE
    return f"{'~' if approximate else ''}{size_text(size_class)} files"


def region_order(epochs: pd.DataFrame) -> list[str]:
    """Regions nearest first: lab profiles by their round trip, then cloud regions by median first-read
    MB/s, fastest first (a measured stand-in for distance; the rows do not say how far a region is)."""
    regions = set(epochs["region"])
    lab = [r for r in LAB_REGIONS_BY_DISTANCE if r in regions]
    first = epochs[epochs["pass"] == 1].groupby("region")["MBps"].median()
    return lab + sorted(regions - set(lab), key=lambda r: (-float(first.get(r, 0.0)), r))


def settings_of(epochs: pd.DataFrame) -> list[tuple[str, str]]:
    """The (region, file size) settings present, nearest region first, then smaller files first."""
    order = {r: i for i, r in enumerate(region_order(epochs))}
    pairs = epochs[["region", "size", "size_class"]].drop_duplicates()
    pairs = sorted(pairs.itertuples(index=False), key=lambda p: (order[p.region], _sortable(p.size_class), p.size))
    return [(p.region, p.size) for p in pairs]


def sizes_of(epochs: pd.DataFrame) -> list[str]:
    """File-size classes present, smallest first."""
    pairs = epochs[["size", "size_class"]].drop_duplicates()
    return [p.size for p in sorted(pairs.itertuples(index=False), key=lambda p: (_sortable(p.size_class), p.size))]


def record_box(fig: Figure, panel: str, x: str, hue: str, data: pd.DataFrame) -> None:
    """Remember what one box (or line point) of ``fig`` pooled, for :func:`dataferry.harness.plots.save`."""
    _BOXES.setdefault(fig, []).append({
        "panel": panel, "x": x, "hue": hue, "n": int(len(data)),
        "regions": sorted(set(data["region"])), "sizes": sorted(set(data["size"])),
        "lessons": sorted(set(data["lesson"]) - {""}),
    })


def recorded_boxes(fig: Figure) -> list[dict[str, Any]]:
    return list(_BOXES.get(fig, []))


def png_metadata(fig: Figure) -> dict[str, str]:
    boxes = recorded_boxes(fig)
    return {PROVENANCE_KEY: json.dumps(boxes, separators=(",", ":"))} if boxes else {}


def box_provenance(png: str | Path) -> list[dict[str, Any]] | None:
    """What each box of a figure saved by :func:`dataferry.harness.plots.save` pooled: panel, x, hue, n, and
    the regions, file sizes and lessons of its rows. None for a PNG without the record (a figure
    drawn by hand rather than by this package)."""
    from PIL import Image

    with Image.open(png) as image:
        text = getattr(image, "text", {}) or image.info
        raw = text.get(PROVENANCE_KEY)
    return None if raw is None else json.loads(raw)


def scope(epochs: pd.DataFrame) -> str:
    return f"regions: {listing(epochs['region'])}; runtimes: {listing(epochs['runtime'])}"


def _size_class(value: float) -> float:
    """Mean file size rounded to a power of two: runs of ~250 KiB and 256 KiB files are one class."""
    if not np.isfinite(value) or value <= 0:
        return math.nan
    return float(2 ** round(math.log2(value)))


def _sortable(size_class: float) -> float:
    return size_class if np.isfinite(size_class) else math.inf


def _labels(values: pd.Series) -> pd.Series:
    text = values.astype("string").fillna("").str.strip()
    return text.mask(text == "", "(blank)").astype(str)


def listing(values: Any, most: int = 4) -> str:
    """The distinct values, sorted, at most ``most`` of them named: "a, b, c +2 more"."""
    names = sorted(set(values))
    if not names:
        return "none"
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} +{len(names) - most} more"
