"""Tests for dataferry.harness.stats: known answers, bootstrap behaviour, grouping and epoch throughput."""

import math

import numpy as np
import pandas as pd
import pytest

from dataferry.harness.stats import (Summary, bootstrap_median_ci, epoch_throughput, speedup, summarize, summarize_frame,
                             three_digits)


def test_summarize_known_answers_even():
    s = summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert s.n == 10
    assert s.median == pytest.approx(5.5)
    assert s.q1 == pytest.approx(3.25)
    assert s.q3 == pytest.approx(7.75)
    assert s.iqr == pytest.approx(4.5)
    assert s.min == 1 and s.max == 10
    assert s.p5 == pytest.approx(1.45)
    assert s.p95 == pytest.approx(9.55)
    assert s.confidence == 0.95
    assert s.ci_low <= s.median <= s.ci_high
    assert 1 <= s.ci_low < s.ci_high <= 10


def test_summarize_known_answers_odd():
    s = summarize([7, 1, 3, 5, 9])  # order must not matter
    assert s.n == 5
    assert s.median == 5
    assert s.q1 == 3 and s.q3 == 7 and s.iqr == 4
    assert s.p5 == pytest.approx(1.4)
    assert s.p95 == pytest.approx(8.6)
    assert (s.min, s.max) == (1, 9)


def test_nan_dropped():
    with_nan = summarize([1.0, float("nan"), 2.0, 3.0, np.nan])
    assert with_nan == summarize([1.0, 2.0, 3.0])
    assert with_nan.n == 3 and with_nan.median == 2.0
    assert bootstrap_median_ci([np.nan, 4.0]) == (4.0, 4.0)


@pytest.mark.parametrize("values", [[], [np.nan, np.nan]])
def test_empty_raises(values):
    with pytest.raises(ValueError):
        summarize(values)
    with pytest.raises(ValueError):
        bootstrap_median_ci(values)


def test_single_value():
    assert bootstrap_median_ci([3.5]) == (3.5, 3.5)
    s = summarize([3.5])
    assert (s.n, s.median, s.ci_low, s.ci_high, s.iqr, s.min, s.max) == (1, 3.5, 3.5, 3.5, 0.0, 3.5, 3.5)


def test_bad_parameters():
    with pytest.raises(ValueError):
        bootstrap_median_ci([1, 2, 3], confidence=1.0)
    with pytest.raises(ValueError):
        bootstrap_median_ci([1, 2, 3], n_boot=0)


def test_deterministic_given_seed():
    x = np.random.default_rng(1).lognormal(0, 1, 40)
    assert bootstrap_median_ci(x, seed=7) == bootstrap_median_ci(x, seed=7)
    assert summarize(x, seed=7) == summarize(x, seed=7)
    assert bootstrap_median_ci(x, seed=7) != bootstrap_median_ci(x, seed=8)


def test_chunked_resampling(monkeypatch):
    # Large samples are resampled in row chunks; the loop must fill every replicate and stay seeded.
    import dataferry.harness.stats as stats

    x = np.random.default_rng(9).lognormal(0, 1, 200)
    monkeypatch.setattr(stats, "_MAX_RESAMPLE_CELLS", 1000)  # 5 rows per chunk
    low, high = bootstrap_median_ci(x, n_boot=503)
    assert low < np.median(x) < high
    assert (low, high) == bootstrap_median_ci(x, n_boot=503)


def test_str():
    s = Summary(n=20, median=12.34, q1=11.0, q3=12.1, iqr=1.1, p5=10.0, p95=14.0, min=9.0, max=15.0,
                ci_low=11.94, ci_high=12.81, confidence=0.95)
    assert str(s) == "median 12.3 [11.9, 12.8] (n=20, IQR 1.1)"
    assert "n=10" in str(summarize(range(1, 11)))


def _coverage(confidence: float, trials: int = 200, n: int = 30) -> float:
    """Share of trials whose CI covers the true median 1.0 of lognormal(mean=0, sigma=1)."""
    rng = np.random.default_rng(2024)
    hits = 0
    for i in range(trials):
        low, high = bootstrap_median_ci(rng.lognormal(0.0, 1.0, n), confidence=confidence, n_boot=1000, seed=i)
        hits += low <= 1.0 <= high
    return hits / trials


def test_bootstrap_coverage():
    cov95 = _coverage(0.95)
    assert 0.85 <= cov95 < 1.0
    # The confidence level must matter: a 50% interval covers far less often than a 95% one.
    cov50 = _coverage(0.50)
    assert 0.30 <= cov50 <= 0.70
    assert cov50 < cov95 - 0.2


def test_ci_narrows_with_n():
    rng = np.random.default_rng(5)
    small = summarize(rng.lognormal(0, 1, 20), n_boot=1000)
    large = summarize(rng.lognormal(0, 1, 500), n_boot=1000)
    width_small = small.ci_high - small.ci_low
    width_large = large.ci_high - large.ci_low
    assert width_large < width_small / 2
    assert large.ci_low <= 1.0 <= large.ci_high


def test_speedup_exact_ratio():
    rng = np.random.default_rng(3)
    b = rng.uniform(1, 2, 50)
    ratio, low, high = speedup(10 * b, b, n_boot=1000)
    assert ratio == pytest.approx(10.0)
    assert low <= 10.0 <= high
    assert low < high  # independent resampling gives a real interval, not a point
    assert high / low < 1.5


def test_speedup_same_distribution():
    rng = np.random.default_rng(4)
    a, b = rng.lognormal(0, 0.5, 60), rng.lognormal(0, 0.5, 60)
    ratio, low, high = speedup(a, b, n_boot=1000)
    assert low <= 1.0 <= high
    assert low <= ratio <= high
    assert speedup(a, b, n_boot=500, seed=1) == speedup(a, b, n_boot=500, seed=1)


def test_speedup_errors():
    with pytest.raises(ValueError):
        speedup([], [1.0])
    with pytest.raises(ValueError):
        speedup([1.0, 2.0], [0.0, 0.0, 1.0])


def _bench_rows() -> pd.DataFrame:
    rows = [
        # method, pass, MBps, error
        ("direct", 1, 10.0, ""),
        ("direct", 1, 20.0, ""),
        ("direct", 1, 30.0, ""),
        ("direct", 1, 0.0, "timeout"),  # excluded: would pull the median down
        ("direct", 2, 40.0, ""),
        ("direct", 2, 50.0, ""),
        ("cached", 1, 12.0, ""),
        ("cached", 1, 14.0, ""),
        ("cached", 2, 100.0, ""),
        ("cached", 2, 200.0, ""),
        ("cached", 2, 300.0, ""),
        ("cached", 2, 400.0, ""),
    ]
    return pd.DataFrame(rows, columns=["method", "pass", "MBps", "error"])


def test_summarize_frame():
    out = summarize_frame(_bench_rows(), by=["method", "pass"], n_boot=200)
    assert list(out.columns) == ["method", "pass", "n", "median", "q1", "q3", "iqr", "p5", "p95", "min", "max",
                                 "ci_low", "ci_high", "errors"]
    got = {(r.method, r.pass_): (r.n, r.median, r.errors) for r in out.rename(columns={"pass": "pass_"}).itertuples()}
    assert got == {
        ("cached", 1): (2, 13.0, 0),
        ("cached", 2): (4, 250.0, 0),
        ("direct", 1): (3, 20.0, 1),
        ("direct", 2): (2, 45.0, 0),
    }
    assert (out["ci_low"] <= out["median"]).all() and (out["median"] <= out["ci_high"]).all()


def test_summarize_frame_missing_errors_and_all_failed():
    rows = _bench_rows()
    rows["error"] = rows["error"].replace("", np.nan)  # as read back from CSV
    rows.loc[len(rows)] = ["broken", 1, 0.0, "HTTP 500"]
    out = summarize_frame(rows, by=["method"], n_boot=200).set_index("method")
    assert out.loc["direct", "n"] == 5 and out.loc["direct", "errors"] == 1
    assert out.loc["broken", "n"] == 0 and out.loc["broken", "errors"] == 1
    assert math.isnan(out.loc["broken", "median"])
    no_error_col = summarize_frame(_bench_rows().drop(columns="error"), by=["method"], n_boot=200)
    assert list(no_error_col["errors"]) == [0, 0]
    assert list(no_error_col["n"]) == [6, 6]


def test_epoch_throughput_known_answer():
    rows = pd.DataFrame({"pass": [1, 1], "repeat": [0, 0], "bytes": [100, 300], "ns": [1_000, 3_000]})
    out = epoch_throughput(rows, by=["pass", "repeat"])
    assert len(out) == 1
    r = out.iloc[0]
    assert (r["files"], r["bytes"], r["ns"]) == (2, 400, 4000)
    assert r["MBps"] == pytest.approx(100.0)


def test_epoch_throughput_is_not_mean_of_rates():
    # One small fast file and one large slow file: 1000 B in 1 us (1000 MB/s), 1e6 B in 10 ms (100 MB/s).
    rows = pd.DataFrame({
        "pass": [1, 1, 2, 2],
        "repeat": [0, 0, 0, 0],
        "bytes": [1_000, 1_000_000, 1_000, 1_000_000],
        "ns": [1_000, 10_000_000, 1_000, 5_000_000],
    })
    rows["MBps"] = rows["bytes"] / rows["ns"] * 1e3
    out = epoch_throughput(rows, by=["pass", "repeat"]).set_index("pass")
    epoch1 = out.loc[1, "MBps"]
    assert epoch1 == pytest.approx(1_001_000 / 10_001_000 * 1e3)  # ~100.09 MB/s
    mean_of_rates = rows.loc[rows["pass"] == 1, "MBps"].mean()  # 550 MB/s
    assert mean_of_rates == pytest.approx(550.0)
    assert abs(epoch1 - mean_of_rates) > 400
    assert out.loc[2, "MBps"] == pytest.approx(1_001_000 / 5_001_000 * 1e3)
    assert list(out["files"]) == [2, 2]


def test_three_digits_shows_three_significant_digits_without_exponents():
    """How lessons print a measured ratio or rate in a sentence: the same digits as a Summary."""
    assert [three_digits(v) for v in (0.01234, 0.5, 1.2345, 12.345, 123.45, 98765.4)] == [
        "0.0123", "0.500", "1.23", "12.3", "123", "98765"]
    assert three_digits(0) == "0.000" and three_digits(float("nan")) == "nan"


def _epoch_rows(lesson: str | None, files: int, mbps: list[float], region: str = "lab:near") -> pd.DataFrame:
    rows = pd.DataFrame({"phase": "epoch", "pass": [1] * len(mbps) + [2] * len(mbps), "error": "",
                         "region": region, "method": "dataferry", "file_bytes": 262144.0,
                         "file": f"({files} files)", "MBps": mbps + [m * 10 for m in mbps]})
    return rows if lesson is None else rows.assign(lesson=lesson)


def test_the_summary_never_pools_two_lessons_or_two_file_counts():
    """Same region, method and file size: rows of two lessons, or of 5 files and of 12, are two settings, each
    with its own median and its own line in the table."""
    from dataferry.harness.bench import summary, summary_table

    rows = pd.concat([_epoch_rows("02_gcsfuse", 5, [1.0, 1.0, 1.0]), _epoch_rows("07_measure_by_region", 12, [9.0, 9.0, 9.0]),
                      _epoch_rows("07_measure_by_region", 5, [4.0, 4.0, 4.0])], ignore_index=True)
    result = summary(rows)
    firsts = sorted((c["lesson"], c["files"], c["median"]) for c in result["cells"] if c["pass"] == 1)
    assert firsts == [("02_gcsfuse", 5, 1.0), ("07_measure_by_region", 5, 4.0), ("07_measure_by_region", 12, 9.0)]
    assert len(result["ratios"]) == 3
    table = summary_table(result).splitlines()
    assert table[0].startswith("| lesson | files | region |") and len(table) == 2 + 3 + 2, table
    assert any("| 02_gcsfuse | 5 | lab:near | dataferry | 256 KiB | 1.0 (3) | 10.0 (3) |" in line for line in table), table


def test_rows_of_one_run_without_a_lesson_are_summarised_by_file_count():
    from dataferry.harness.bench import summary, summary_table

    rows = pd.concat([_epoch_rows(None, 5, [1.0, 1.0]), _epoch_rows(None, 12, [3.0, 3.0])], ignore_index=True)
    result = summary(rows)
    assert sorted((c["files"], c["median"]) for c in result["cells"] if c["pass"] == 1) == [(5, 1.0), (12, 3.0)]
    assert summary_table(result).splitlines()[0].startswith("| files | region |")


def test_rows_of_two_runtime_kinds_are_two_settings():
    from dataferry.harness.bench import summary, summary_table

    rows = pd.concat([_epoch_rows(None, 5, [1.0, 1.0]).assign(runtime="colab-cpu"),
                      _epoch_rows(None, 5, [3.0, 3.0]).assign(runtime="colab-gpu")], ignore_index=True)
    result = summary(rows)
    assert sorted((c["runtime"], c["median"]) for c in result["cells"] if c["pass"] == 1) == [("colab-cpu", 1.0), ("colab-gpu", 3.0)]
    assert summary_table(result).splitlines()[0].startswith("| files | region | runtime |")


def test_the_summary_says_the_cache_state_each_column_started_in_and_where_it_ran():
    """The table's first-read and repeat columns name no state: the line under it says which each method's epochs
    started in (a method whose repeats started in two states is listed under both), and the runtime a single-runtime
    table has no column for; rows from before cache states were recorded say so."""
    from dataferry.harness.bench import summary, summary_table

    rows = pd.concat([_epoch_rows(None, 5, [1.0, 1.0]).assign(method=m) for m in ("gcsfuse", "dataferry")],
                     ignore_index=True).assign(runtime="local-cpu")
    rows["cache_state"] = ["cold_verified", "cold_verified", "cold_verified", "page_warm",
                           "cold_verified", "cold_verified", "local_copy", "local_copy"]
    table = summary_table(summary(rows)).splitlines()
    assert table[-1] == ("Each epoch started in: first read cold_verified (dataferry, gcsfuse); repeat cold_verified "
                         "(gcsfuse), local_copy (dataferry), page_warm (gcsfuse). Runtime: local-cpu."), table
    assert table[-2] == "" and table[0].startswith("| files | region | method |")
    old = summary_table(summary(rows.drop(columns=["cache_state", "runtime"]))).splitlines()
    assert old[-1] == "Each epoch started in: not recorded (rows from before cache states were).", old
    blank = summary_table(summary(rows.assign(cache_state=""))).splitlines()  # how a CSV's empty cells load
    assert blank[-1] == "Each epoch started in: not recorded (rows from before cache states were). Runtime: local-cpu."
