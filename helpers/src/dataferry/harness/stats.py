"""Summary statistics for benchmark results: medians with bootstrap confidence intervals.

Benchmark timings are skewed and noisy, so results are reported as a median with a percentile
bootstrap CI and quartiles rather than a mean and standard deviation. Every random draw comes from
``numpy.random.default_rng(seed)``, so the same inputs and seed always give the same numbers.

Rows are a long-format :class:`pandas.DataFrame` with (at least) the columns ``method``,
``region``, ``runtime``, ``pass``, ``phase``, ``file_bytes``, ``concurrency``, ``bytes``, ``ns``
(wall time of the operation), ``MBps`` (10^6 bytes/s) and ``error`` (empty when the operation
succeeded). Only numpy and pandas are used, so this module imports without the rest of dataferry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "Summary",
    "bootstrap_median_ci",
    "epoch_throughput",
    "error_mask",
    "speedup",
    "summarize",
    "summarize_frame",
    "three_digits",
]

_STAT_COLUMNS = ["n", "median", "q1", "q3", "iqr", "p5", "p95", "min", "max", "ci_low", "ci_high"]
_MAX_RESAMPLE_CELLS = 4_000_000  # caps the resample matrix in memory; chunking keeps results seeded


@dataclass(frozen=True)
class Summary:
    """Robust summary of one sample: percentiles plus a bootstrap CI of the median."""

    n: int
    median: float
    q1: float
    q3: float
    iqr: float
    p5: float
    p95: float
    min: float
    max: float
    ci_low: float
    ci_high: float
    confidence: float

    def __str__(self) -> str:
        """One line for logs and tables, e.g. ``median 12.3 [11.9, 12.8] (n=20, IQR 1.1)``.

        All four numbers use the decimals that give the median three significant digits.
        """
        d = _decimals(self.median)
        return (
            f"median {self.median:.{d}f} [{self.ci_low:.{d}f}, {self.ci_high:.{d}f}] "
            f"(n={self.n}, IQR {self.iqr:.{d}f})"
        )


def three_digits(v: float) -> str:
    """``v`` to three significant digits, without an exponent (``0.0123``, ``1.23``, ``123``,
    ``98765``): how a lesson's sentence shows a measured ratio or rate, as :class:`Summary` does."""
    return f"{v:.{_decimals(v)}f}"


def _decimals(v: float) -> int:
    """Decimals that show ``v`` to three significant digits, without scientific notation."""
    if not math.isfinite(v) or v == 0:
        return 3
    return max(0, 2 - math.floor(math.log10(abs(v))))


def _clean(values: Iterable[float] | np.ndarray | pd.Series) -> np.ndarray:
    """Flatten to a float array and drop NaN (missing measurements are not zeros)."""
    x = np.asarray(values, dtype=float).ravel()
    return x[~np.isnan(x)]


def _check(confidence: float, n_boot: int) -> None:
    """Reject parameters that would give a meaningless interval."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def _boot_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``n_boot`` resamples of ``x`` with replacement, drawn as (rows, n) index matrices.

    The matrix is drawn in row chunks so a large sample cannot exhaust memory; the chunk size
    depends only on ``len(x)``, so results stay a pure function of the inputs and the generator.
    """
    n = len(x)
    rows = max(1, _MAX_RESAMPLE_CELLS // n)
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(x[idx], axis=1)
    return out


def _interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates."""
    alpha = (1 - confidence) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    return float(low), float(high)


def bootstrap_median_ci(
    values: Iterable[float] | np.ndarray | pd.Series,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median, so a reported median carries its uncertainty.

    NaN values are dropped. One value gives ``(v, v)``; no values raises :class:`ValueError`.
    """
    _check(confidence, n_boot)
    x = _clean(values)
    if len(x) == 0:
        raise ValueError("cannot bootstrap an empty sample")
    if len(x) == 1:
        return float(x[0]), float(x[0])
    return _interval(_boot_medians(x, n_boot, np.random.default_rng(seed)), confidence)


def summarize(
    values: Iterable[float] | np.ndarray | pd.Series,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Summary:
    """Median, quartiles, 5th/95th percentiles, range and bootstrap CI of one sample.

    NaN values are dropped first; percentiles use numpy's default linear interpolation.
    Raises :class:`ValueError` when no values remain.
    """
    x = _clean(values)
    if len(x) == 0:
        raise ValueError("cannot summarize an empty sample")
    p5, q1, median, q3, p95 = (float(v) for v in np.percentile(x, [5, 25, 50, 75, 95]))
    ci_low, ci_high = bootstrap_median_ci(x, confidence=confidence, n_boot=n_boot, seed=seed)
    return Summary(
        n=len(x),
        median=median,
        q1=q1,
        q3=q3,
        iqr=q3 - q1,
        p5=p5,
        p95=p95,
        min=float(x.min()),
        max=float(x.max()),
        ci_low=ci_low,
        ci_high=ci_high,
        confidence=confidence,
    )


def error_mask(rows: pd.DataFrame) -> pd.Series:
    """True for rows whose ``error`` column is non-empty (all False when there is no such column)."""
    if "error" not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows["error"].fillna("").astype(str).str.len() > 0


def _groups(rows: pd.DataFrame, by: list[str]) -> Iterable[tuple[tuple, pd.DataFrame]]:
    """Yield (key tuple, group) in sorted key order; an empty ``by`` is one group of all rows."""
    if not by:
        yield (), rows
        return
    for key, group in rows.groupby(list(by), sort=True, dropna=False):
        yield (key if isinstance(key, tuple) else (key,)), group


def summarize_frame(
    rows: pd.DataFrame,
    by: list[str],
    value: str = "MBps",
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """One :func:`summarize` row per group of ``by``, for comparison tables and plots.

    Rows with a non-empty ``error`` are left out of the statistics and counted in ``errors``, so a
    failure never shows up as a fast or slow measurement. A group with no usable values keeps its
    row, with ``n`` 0 and NaN statistics. Columns: ``by`` + n, median, q1, q3, iqr, p5, p95, min,
    max, ci_low, ci_high, errors. Every group is bootstrapped with the same ``seed``.
    """
    errors = error_mask(rows)
    records = []
    for key, group in _groups(rows, by):
        bad = errors.loc[group.index]
        ok = _clean(group.loc[~bad, value])
        record = dict(zip(by, key))
        if len(ok):
            s = summarize(ok, confidence=confidence, n_boot=n_boot, seed=seed)
            record.update({c: getattr(s, c) for c in _STAT_COLUMNS})
        else:
            record.update({c: math.nan for c in _STAT_COLUMNS})
            record["n"] = 0
        record["errors"] = int(bad.sum())
        records.append(record)
    out = pd.DataFrame.from_records(records, columns=[*by, *_STAT_COLUMNS, "errors"])
    return out.astype({"n": int, "errors": int})


def speedup(
    a: Iterable[float] | np.ndarray | pd.Series,
    b: Iterable[float] | np.ndarray | pd.Series,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio of medians ``median(a) / median(b)`` with a percentile bootstrap CI.

    ``a`` and ``b`` are resampled independently (they are separate runs, not paired) and the CI is
    taken over the ratios of the resampled medians. Returns ``(ratio, low, high)``. NaN values are
    dropped; an empty sample or a zero median of ``b`` raises :class:`ValueError`.
    """
    _check(confidence, n_boot)
    xa, xb = _clean(a), _clean(b)
    if len(xa) == 0 or len(xb) == 0:
        raise ValueError("speedup needs two non-empty samples")
    mb = float(np.median(xb))
    if mb == 0:
        raise ValueError("median of b is zero; the ratio is undefined")
    ratio = float(np.median(xa)) / mb
    rng = np.random.default_rng(seed)
    boot_a = _boot_medians(xa, n_boot, rng)
    boot_b = _boot_medians(xb, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        low, high = _interval(boot_a / boot_b, confidence)
    return ratio, low, high


def epoch_throughput(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Aggregate throughput per epoch: ``sum(bytes) / sum(ns)`` in MB/s, one row per group of ``by``.

    ``by`` should include ``pass`` and ``repeat`` so each group is one epoch. This is total bytes
    over total time, not the mean of per-file rates, which overweights small fast files. ``ns`` is
    summed over operations, so with ``concurrency`` > 1 it is busy time across workers, not the
    epoch's elapsed time. All rows count, failed ones included (their time was spent). Columns:
    ``by`` + files, bytes, ns, MBps (NaN when ``ns`` sums to 0).
    """
    records = []
    for key, group in _groups(rows, by):
        total_bytes = int(group["bytes"].sum())
        total_ns = int(group["ns"].sum())
        record = dict(zip(by, key))
        record.update(
            files=len(group),
            bytes=total_bytes,
            ns=total_ns,
            MBps=total_bytes / total_ns * 1e3 if total_ns else math.nan,
        )
        records.append(record)
    return pd.DataFrame.from_records(records, columns=[*by, "files", "bytes", "ns", "MBps"])
