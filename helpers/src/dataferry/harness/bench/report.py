"""What a comparison's rows add up to: medians with confidence intervals, a table, figures and JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataferry.harness.bench.methods import Target
from dataferry.harness.results import Results, recorded_cache_states, size_text

__all__ = ["summary", "summary_table", "say_failures"]


def _setting(epochs: Any) -> list[str]:
    """The columns that make one setting: rows differing in any are never pooled. The lesson (when the rows
    carry one, as pooled results do), the number of files an epoch read, the region, the runtime kind (when
    the rows hold more than one) and the file size."""
    runtimes = ["runtime"] if "runtime" in epochs.columns and epochs["runtime"].nunique() > 1 else []
    return (["lesson"] if "lesson" in epochs.columns else []) + ["files", "region", *runtimes]


def say_failures(rows: Any, say: Callable[[str], None] = print) -> None:
    """Say how many rows failed and the first one's error; nothing when none did (or the rows have no
    ``error`` column). Failed rows never count as fast or slow measurements: :func:`summary` and the
    figures leave them out, and this says so."""
    from dataferry.harness.stats import error_mask

    failed = rows[error_mask(rows)]
    if len(failed):
        say(f"{len(failed)} of {len(rows)} rows failed and are left out of the medians and figures, e.g.: "
            f"{failed['error'].iloc[0][:300]}")


def summary(rows: Any) -> dict[str, Any]:
    """Median epoch MB/s per setting x method x pass (with bootstrap CIs) and repeat/first ratios.

    A setting is a lesson (when the rows name one), a file count, a region and a file size: the median of
    five files and of twelve, or of two lessons, would describe neither (MEASUREMENT.md rule 9)."""
    import pandas as pd

    from dataferry.harness.stats import speedup, summarize_frame

    epochs = rows[(rows["phase"] == "epoch") & (rows["pass"] >= 1)].copy()
    epochs["pass"] = epochs["pass"].astype(int)
    counted = epochs["file"].astype(str).str.extract(r"\((\d+) files\)")[0]
    epochs["files"] = pd.to_numeric(counted, errors="coerce").fillna(0).astype(int)
    keys = [*_setting(epochs), "method", "file_bytes"]
    ok = epochs[epochs["error"] == ""]
    cells = summarize_frame(epochs, [*keys, "pass"]).to_dict("records")
    ratios = []
    for key, g in ok.groupby(keys):
        first, repeat = g[g["pass"] == 1]["MBps"], g[g["pass"] >= 2]["MBps"]
        if len(first) and len(repeat):
            r, lo, hi = speedup(repeat.to_numpy(float), first.to_numpy(float))
            ratios.append({**dict(zip(keys, key)), "repeat_over_first": r, "ci_low": lo, "ci_high": hi})
    runtimes = sorted({str(r) for r in ok["runtime"].dropna() if str(r)}) if "runtime" in ok.columns else []
    return {"keys": keys, "cells": cells, "ratios": ratios, "started_in": _started_in(ok), "runtimes": runtimes}


def _started_in(epochs: Any) -> dict[str, dict[str, list[str]]] | None:
    """The cache states the first reads and the repeats started in, each with the methods whose epochs did (None:
    rows from before cache states were recorded)."""
    recorded = recorded_cache_states(epochs)
    if recorded is None:
        return None
    states = recorded.fillna("not recorded").astype(str)
    return {kind: {str(state): sorted(g["method"].astype(str).unique()) for state, g in epochs[part].groupby(states[part])}
            for kind, part in (("first read", epochs["pass"] == 1), ("repeat", epochs["pass"] >= 2))}


def _started_in_line(result: dict[str, Any]) -> str:
    """What the table's columns started in, and the runtime a table of one runtime has no column for."""
    started = result["started_in"]
    if started is None:
        line = "Each epoch started in: not recorded (rows from before cache states were)."
    else:
        line = "Each epoch started in: " + "; ".join(
            f"{kind} " + ", ".join(f"{state} ({', '.join(methods)})" for state, methods in sorted(by_state.items()))
            for kind, by_state in started.items() if by_state) + "."
    if len(result.get("runtimes", [])) == 1:
        line += f" Runtime: {result['runtimes'][0]}."
    return line


def _order(key: tuple) -> tuple:
    """Numbers by value, names alphabetically: 5 files before 12."""
    return tuple((0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v)) for v in key)


def summary_table(result: dict[str, Any]) -> str:
    """A markdown table: median MB/s of the first and repeated epochs, and their ratio, one line per setting
    and method."""
    keys = result.get("keys", ["region", "method", "file_bytes"])
    med = {(*(c[k] for k in keys), c["pass"]): c for c in result["cells"]}
    ratio = {tuple(r[k] for k in keys): r for r in result["ratios"]}
    head = [k for k in keys if k != "file_bytes"]
    lines = ["| " + " | ".join(head) + " | file size | first read MB/s (n) | repeat MB/s (n) | repeat / first [95% CI] |",
             "|" + "---|" * (len(head) + 4)]
    for key in sorted({tuple(c[k] for k in keys) for c in result["cells"]}, key=_order):
        first = med.get((*key, 1))
        repeats = [c for (*k, ps), c in med.items() if tuple(k) == key and ps >= 2]
        r = ratio.get(key)

        def cell(c: dict | None) -> str:
            return f"{c['median']:.1f} ({c['n']})" if c and c["n"] else "-"

        rtxt = f"{r['repeat_over_first']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r else "-"
        size = key[-1]
        shown = [str(v) for k, v in zip(keys, key) if k != "file_bytes"]
        lines.append(f"| {' | '.join(shown)} | {size_text(size) if size == size else '-'} | {cell(first)} "
                     f"| {cell(repeats[0] if repeats else None)} | {rtxt} |")
    if "started_in" in result:
        lines += ["", _started_in_line(result)]
    return "\n".join(lines)


def write_summary(results: Results, out: Path, json_path: Path, say: Callable[[str], None], extra: dict | None = None) -> dict:
    from dataferry.harness.plots import standard_figures
    from dataferry.harness.results import load_results

    results.close()
    rows = load_results(results.csv_path, run_id=results.run_id)  # this run only, in a folder that holds others
    result = {"run_id": results.run_id, "results": str(results.csv_path), **summary(rows), **(extra or {})}
    figures = standard_figures(rows, out / "figures")
    result["figures"] = {k: [str(p) for p in v] for k, v in figures.items()}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, default=str))
    say(summary_table(result))
    say(f"\nrows: {results.csv_path}\nfigures: {out / 'figures'}\nsummary: {json_path}")
    return result


def bucket_location(target: Target) -> str | None:
    """The bucket's location (region analysis needs both ends), or None for a folder or when not allowed."""
    if target.bucket is None:
        return None
    try:
        target.bucket.reload()
        return target.bucket.location
    except Exception:  # noqa: BLE001 - reading bucket metadata needs a permission many readers lack
        return None


def gpu_rows(results: Results, batch: bytes, common: dict[str, str], say: Callable[[str], None]) -> str:
    """Time host-to-device copies of a loaded batch where there is CUDA; say so where there is not."""
    from dataferry.harness.timing import time_h2d

    rows = time_h2d(batch)
    if isinstance(rows, str):
        say(rows)
        results.write_meta(gpu=rows)
        return rows
    for row in rows:
        results.add(**common, **row)
    return f"{len(rows)} host-to-device rows"
