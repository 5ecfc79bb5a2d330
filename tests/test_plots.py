"""Tests for dataferry.harness.plots: files written, stable colours, what the boxes count, and empty input."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("seaborn")

from dataferry.harness.plots import (  # noqa: E402
    LAB_REGIONS_BY_DISTANCE,
    METHOD_ORDER,
    box_provenance,
    by_region,
    by_runtime,
    first_vs_repeat,
    method_palette,
    per_epoch,
    save,
    standard_figures,
)
from dataferry.harness.results import COLUMNS  # noqa: E402

METHODS = ("local", "gcsfuse", "api-serial")
REGIONS = ("lab:cross-continent", "us-central1")
BASE_MBPS = {"local": 2000.0, "gcsfuse": 80.0, "api-serial": 25.0}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(**values) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update(run_id="r1", time_utc="2024-01-01T00:00:00Z", region_source="test", file_bytes=1_000_000,
               concurrency=1, retries=0, cache_state="cold_verified", eviction="fadvise")
    row.update(values)
    return row


def make_rows(methods=METHODS, passes=(1, 2), repeats=5, regions=REGIONS, runtimes=("local-cpu",),
              seed=0, file_bytes=(1_000_000,)) -> pd.DataFrame:
    """Epoch rows for every combination, a few read rows, and one failed epoch row."""
    rng = np.random.default_rng(seed)
    rows = []
    for method in methods:
        for region in regions:
            for runtime in runtimes:
                for p in passes:
                    for r in range(repeats):
                        for size in file_bytes:
                            mbps = BASE_MBPS.get(method, 100.0) * (1 if p == 1 else 5) * rng.uniform(0.8, 1.2)
                            nbytes = 100_000_000
                            ns = int(nbytes / mbps * 1e3)
                            rows.append(_row(method=method, region=region, runtime=runtime, file="", bytes=nbytes,
                                             file_bytes=size, ns=ns, MBps=mbps, phase="epoch", repeat=r, error="",
                                             **{"pass": p}))
                # read rows for the same groups: must not be counted in the epoch figures
                rows.append(_row(method=method, region=region, runtime=runtimes[0], file="a.bin", bytes=1_000_000,
                                 ns=10_000_000, MBps=100.0, phase="read", repeat=0, error="", **{"pass": 1}))
    rows.append(_row(method=methods[0], region=regions[0], runtime=runtimes[0], phase="epoch", repeat=99,
                     bytes=0, ns=1, MBps=1e7, error="TimeoutError: read timed out", **{"pass": 1}))
    return pd.DataFrame(rows, columns=COLUMNS)


def _n_labels(ax) -> list[int]:
    return [int(m.group(1)) for t in ax.texts if (m := re.fullmatch(r"n=(\d+)", t.get_text()))]


def _all_text(fig) -> str:
    texts = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        texts += [t.get_text() for t in ax.texts] + [ax.get_title()]
    return "\n".join(texts)


def test_standard_figures_writes_svg_and_png(tmp_path):
    rows = make_rows(runtimes=("local-cpu", "colab-gpu"))
    written = standard_figures(rows, tmp_path / "figs", prefix="t_")
    assert set(written) == {"first_vs_repeat", "by_region", "by_runtime", "per_epoch"}
    files = [p for paths in written.values() for p in paths]
    assert len(files) == 8 and len(set(files)) == 8
    assert sorted(p.suffix for p in files) == [".png"] * 4 + [".svg"] * 4
    for name, (svg, png) in written.items():
        assert svg.name == f"t_{name}.svg" and png.name == f"t_{name}.png"
        assert svg.parent == tmp_path / "figs"
        assert svg.stat().st_size > 0 and png.stat().st_size > 0
        assert png.read_bytes()[:8] == PNG_MAGIC
        text = "".join(ET.parse(svg).getroot().itertext())
        for method in METHODS:
            assert method in text, f"{method} not in {svg.name}"
        assert "lab: offline lab profile" in text


def test_method_palette_stable_and_distinct():
    everything = method_palette([*METHOD_ORDER, "zz-custom", "aa-custom"])
    assert len(set(everything.values())) == len(everything) == len(METHOD_ORDER) + 2
    for method in METHOD_ORDER:
        assert method_palette([method])[method] == everything[method]
    assert method_palette(["gcsfuse", "local"]) == {m: everything[m] for m in ("gcsfuse", "local")}
    assert method_palette(["zz-custom"])["zz-custom"] == method_palette(["zz-custom", "local"])["zz-custom"]
    colour = everything["local"]
    assert isinstance(colour, tuple) and len(colour) == 3 and all(0 <= c <= 1 for c in colour)


def test_first_vs_repeat_present_methods_log_scale_and_n():
    rows = make_rows(methods=("api-serial", "local"), regions=("us-central1",))
    fig = first_vs_repeat(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["local", "api-serial"]  # METHOD_ORDER, not input order
    assert ax.get_yscale() == "log"
    assert "log scale" in ax.get_ylabel()
    assert _n_labels(ax) == [5, 5, 5, 5]  # 2 methods x (first read, repeat)
    assert "us-central1" in ax.get_title() and "local-cpu" in ax.get_title()
    assert "lab: offline" not in _all_text(fig)
    assert "1 failed epoch" in _all_text(fig)


def test_n_labels_match_group_sizes_in_each_region_panel():
    rows = make_rows(runtimes=("local-cpu", "colab-gpu"))
    fig = first_vs_repeat(rows)
    assert [ax.get_title() for ax in fig.axes] == ["lab:cross-continent, ~1 MiB files", "us-central1, ~1 MiB files"]
    ok = rows[(rows["phase"] == "epoch") & (rows["error"] == "")]
    for ax, region in zip(fig.axes, REGIONS):
        mine = ok[ok["region"] == region]
        expected = mine.groupby(["method", mine["pass"] >= 2]).size()
        assert sorted(_n_labels(ax)) == sorted(expected.tolist()) == [10] * 6, "two runtimes pool; regions do not"
    assert "lab: offline lab profile, not a cloud measurement" in _all_text(fig)


def test_error_rows_are_excluded():
    rows = make_rows(regions=("us-central1",))
    failed = rows.iloc[[0]].assign(error="ConnectionError", MBps=5e6)
    fig = first_vs_repeat(pd.concat([rows, failed], ignore_index=True))
    ax = fig.axes[0]
    assert _n_labels(ax) == [5] * 6
    assert ax.get_ylim()[1] < 5e6


def test_faceted_figures_and_per_epoch():
    rows = make_rows()
    fig = by_region(rows)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == list(REGIONS)
        assert ax.get_yscale() == "log"
        assert _n_labels(ax) == [5] * 6  # 2 regions x 3 methods
    fig = by_runtime(rows)
    assert "no region and file size\nwas measured on two runtime kinds" in _all_text(fig), \
        "one runtime kind per setting says nothing about runtimes"
    assert all(_n_labels(ax) == [] for ax in fig.axes)
    fig = by_runtime(make_rows(runtimes=("local-cpu", "colab-gpu")))
    assert len(fig.axes) == 4  # two settings (regions) with two runtimes each, first read and repeat
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["colab-gpu", "local-cpu"]
    assert _n_labels(fig.axes[0]) == [5] * 6
    fig = per_epoch(rows)
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [label.split()[0] for label in labels] == ["local", "gcsfuse", "api-serial"]


@pytest.mark.parametrize("draw", [first_vs_repeat, by_region, by_runtime, per_epoch], ids=lambda d: d.__name__)
def test_no_box_pools_two_regions_or_two_file_sizes_and_the_png_says_so(draw, tmp_path):
    rows = make_rows(runtimes=("local-cpu", "colab-gpu"), file_bytes=(256 * 1024, 2 * 1024 * 1024))
    rows["lesson"] = "07_by_region"
    _, png = save(draw(rows), tmp_path / draw.__name__)
    boxes = box_provenance(png)
    assert boxes, "every box is recorded in the PNG"
    for box in boxes:
        assert len(box["regions"]) == 1 and len(box["sizes"]) == 1 and box["lessons"] == ["07_by_region"], box
    assert {box["sizes"][0] for box in boxes} == {"256 KiB files", "2 MiB files"}
    assert {box["regions"][0] for box in boxes} == set(REGIONS)
    ok = rows[(rows["phase"] == "epoch") & (rows["error"] == "")]
    assert sum(box["n"] for box in boxes) == len(ok), "every usable row is in exactly one box"


def test_a_figure_drawn_by_hand_has_no_box_record(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plt.close(fig)
    ax.plot([1, 2], [3, 4])
    _, png = save(fig, tmp_path / "hand")
    assert box_provenance(png) is None


def test_regions_run_nearest_first_lab_profiles_by_round_trip():
    from dataferry.course.lab.profiles import PROFILES

    assert list(LAB_REGIONS_BY_DISTANCE) == [f"lab:{p.name}" for p in sorted(PROFILES.values(), key=lambda p: p.rtt_ms)]
    regions = ("lab:cross-continent", "lab:colocated", "lab:same-continent")
    fig = by_region(make_rows(regions=regions))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == \
        ["lab:colocated", "lab:same-continent", "lab:cross-continent"]


def test_a_box_of_equal_values_keeps_its_method_colour():
    from dataferry.harness.plots import method_palette

    rows = make_rows(methods=("gcsfuse",), regions=("us-central1",), repeats=3)
    rows.loc[rows["phase"] == "epoch", "MBps"] = 50.0
    ax = first_vs_repeat(rows).axes[0]
    dots = [c for c in ax.collections if c.get_gid() == "values"]
    assert len(dots) == 2, "first read and repeat each show their values"
    colour = method_palette(["gcsfuse"])["gcsfuse"]
    assert all(np.allclose(c.get_facecolor()[0][:3], colour) for c in dots)


def test_first_vs_repeat_on_callers_axes_refuses_two_regions():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        with pytest.raises(ValueError, match="2 region and file-size settings"):
            first_vs_repeat(make_rows(), ax=ax)
    finally:
        plt.close(fig)


def test_empty_frame_says_no_data(tmp_path):
    empty = pd.DataFrame(columns=COLUMNS)
    for draw in (first_vs_repeat, by_region, by_runtime, per_epoch):
        fig = draw(empty)
        assert any(t.get_text() == "no data" for ax in fig.axes for t in ax.texts), draw.__name__
    written = standard_figures(empty, tmp_path)
    assert len(written) == 4
    for svg, png in written.values():
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert "no data" in "".join(ET.parse(svg).getroot().itertext())


def test_panel_without_data_says_so_and_others_keep_their_ticks():
    fig = by_region(make_rows(passes=(1,)))
    first, repeat = fig.axes
    assert _n_labels(first) == [5] * 6
    assert any(t.get_text() == "no data" for t in repeat.texts)
    assert not any(t.get_text() == "no data" for t in first.texts)
    assert len(first.get_yticks()) > 0


def test_first_vs_repeat_on_callers_axes():
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    try:
        assert first_vs_repeat(make_rows(regions=("lab:cross-continent",)), ax=right) is fig
        assert _n_labels(right) == [5] * 6 and _n_labels(left) == []
        assert "lab: offline lab profile" in right.get_title()
    finally:
        plt.close(fig)


def test_missing_columns_is_an_error():
    with pytest.raises(ValueError, match="MBps"):
        first_vs_repeat(pd.DataFrame({"method": ["local"]}))


@pytest.mark.parametrize("lo, hi, labelled", [(3.0, 6.0, {"3", "4", "5", "6"}), (2.0, 80.0, {"5", "10", "20", "50"})])
def test_a_log_axis_within_a_decade_labels_every_whole_step(lo, hi, labelled):
    """Values of 3.5-4.6 s must be readable off the axis: a span under a decade labels 2, 3, ... 9."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots import log_axis

    fig, ax = plt.subplots()
    ax.set_ylim(lo, hi)
    log_axis(ax)
    fig.canvas.draw()
    shown = {t.get_text() for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()
             if t.get_text() and lo <= t.get_position()[1] <= hi}
    plt.close(fig)
    assert labelled <= shown and ("3" in shown) is (hi / lo < 10)


def test_the_au_figure_keeps_a_linear_percent_axis_when_a_panel_has_no_rows():
    """One compute profile run in one region only: its empty panel says so and leaves the shared axis 0-105%."""
    import warnings

    import pandas as pd

    from dataferry.harness.plots import au_by_method

    rows = pd.DataFrame([{"phase": "train", "error": "", "pass": p, "method": "cache", "au": 0.5, "region": r,
                          "compute_profile": c, "lesson": "08", "runtime": "cpu", "bytes": 1, "samples": 1}
                         for p in (1, 2) for r, c in (("lab:near", "a"), ("lab:near", "b"), ("lab:far", "a"))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = au_by_method(rows)
    assert all(ax.get_yscale() == "linear" and ax.get_ylim() == (0, 105) for ax in fig.axes)


@pytest.mark.parametrize("passes, later", [((1, 2), "epoch 2"), ((1, 2, 3), "epochs 2-3")])
def test_the_au_figure_names_its_later_epochs_and_each_ones_cache_state(passes, later):
    """The legend says which epochs the solid bars are, and the figure the cache state each method's epochs
    started in (from the rows), or that the rows do not record it."""
    import pandas as pd

    from dataferry.harness.plots import au_by_method

    def fig_title(fig):
        return fig._suptitle.get_text()

    def texts(fig):
        legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        return legend, " ".join(t.get_text().replace("\n", " ") for t in fig.texts)

    rows = pd.DataFrame([{"phase": "train", "error": "", "pass": p, "method": m, "au": 0.5, "region": "lab:near",
                          "compute_profile": "a", "lesson": "08", "runtime": "cpu", "bytes": 1, "samples": 1,
                          "cache_state": "local_copy" if m == "cache" and p > 1 else "cold_verified"} for p in passes for m in ("gcsfuse", "cache")])
    legend, note = texts(au_by_method(rows))
    figure = au_by_method(rows)
    assert fig_title(figure).endswith(f"epoch 1 and {later}"), fig_title(figure)
    assert legend[:2] == ["epoch 1", later], legend
    assert (f"cache states: epoch 1 cold_verified (gcsfuse, cache); {later} cold_verified (gcsfuse), "
            "local_copy (cache)") in note, note
    assert "cache states: not recorded" in texts(au_by_method(rows.drop(columns="cache_state")))[1]
