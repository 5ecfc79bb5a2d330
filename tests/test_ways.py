"""bench.ways.interleave and medians, and plots.medians_and_dots: the side-by-side harness the lessons call."""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dataferry.harness import plots  # noqa: E402
from dataferry.harness.bench import Turn, interleave, medians  # noqa: E402
from dataferry.errors import BadArgument  # noqa: E402


def test_every_round_runs_every_way_once_in_a_fresh_shuffled_order_and_times_it():
    calls: list[tuple[str, int]] = []

    def way(name, pause):
        def run(turn: Turn):
            assert turn.way == name and turn.folder is None
            calls.append((name, turn.repeat))
            time.sleep(pause)
        return run

    ways = {"slow": way("slow", 0.03), "fast": way("fast", 0.0), "middle": way("middle", 0.01)}
    rows = interleave(ways, repeats=6, seed=1)
    assert len(rows) == 18 and list(rows.columns[:4]) == ["way", "repeat", "order", "seconds"]
    rounds = [[n for n, r in calls if r == k] for k in range(1, 7)]
    assert all(sorted(r) == sorted(ways) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1, "every round ran in the same order: not shuffled"
    assert rows["way"].tolist()[:3] == ["slow", "fast", "middle"]  # rows in the order given; order says when
    ran = rows[rows["repeat"] == 1].sort_values("order")["way"].tolist()
    assert ran == rounds[0]
    by = rows.groupby("way")["seconds"].median()
    assert by["slow"] >= 0.03 and by["middle"] >= 0.01 and by["fast"] < by["slow"]  # each call's own time
    assert interleave(ways, 6, seed=1)["order"].tolist() == rows["order"].tolist()  # the seed decides


def test_a_way_returns_its_own_values_its_own_seconds_or_several_rows_and_the_warm_up_is_dropped(tmp_path):
    seen = []

    def one(turn):
        seen.append(turn.repeat)
        (turn.folder / "x").write_bytes(b"12345")
        return {"bytes": 5, "seconds": 99.0}

    def epochs(turn):
        assert list(turn.folder.iterdir()) == []  # fresh and empty every call
        return [{"epoch": 1, "seconds": 2.0}, {"epoch": 2, "seconds": 1.0}]

    (tmp_path / "1-epochs" / "stale").mkdir(parents=True)  # an earlier run's leftovers: gone before the call
    rows = interleave({"one": one, "epochs": epochs}, repeats=2, warm_up=True, work_dir=tmp_path)
    assert seen == [0, 1, 2] and set(rows["repeat"]) == {1, 2}
    assert rows[rows["way"] == "one"]["seconds"].tolist() == [99.0, 99.0]
    assert rows[rows["way"] == "epochs"]["epoch"].tolist() == [1, 2, 1, 2]
    assert list(tmp_path.iterdir()) == []  # every folder deleted after its call
    said = []
    interleave({"one": one}, 1, work_dir=tmp_path, say=said.append)
    assert said == ["repeat 1/1: one 99 s"]


@pytest.mark.parametrize("ways, repeats", [({}, 3), ({"a": lambda t: None}, 0), ({"a": lambda t: None}, 2.5),
                                            ({"a": 3}, 3), ({"": lambda t: None}, 3)])
def test_ways_and_repeats_that_cannot_work_are_refused(ways, repeats):
    with pytest.raises(BadArgument):
        interleave(ways, repeats)


def test_a_way_that_returns_something_else_is_named():
    with pytest.raises(BadArgument, match="'odd' returned int"):
        interleave({"odd": lambda t: 3}, 1)


def test_medians_keeps_the_ways_order_and_gives_intervals():
    rows = pd.DataFrame({"way": ["b", "a", "b", "a", "b", "a"], "seconds": [3.0, 1.0, 5.0, 2.0, 4.0, 9.0]})
    table = medians(rows)
    assert table["way"].tolist() == ["b", "a"]
    assert table["median_seconds"].tolist() == [4.0, 2.0] and table["n"].tolist() == [3, 3]
    assert table["min_seconds"].tolist() == [3.0, 1.0] and table["max_seconds"].tolist() == [5.0, 9.0]
    assert (table["ci_low_seconds"] <= table["median_seconds"]).all()
    assert (table["median_seconds"] <= table["ci_high_seconds"]).all()
    failed = medians(rows.assign(error=["", "", "reset", "", "", ""]))
    assert failed["errors"].tolist() == [1, 0] and failed["median_seconds"].tolist() == [3.5, 2.0]
    with pytest.raises(BadArgument, match="no column 'MBps'"):
        medians(rows, "MBps")


def test_medians_and_dots_draws_a_median_line_and_every_value_per_group():
    rows = pd.DataFrame({"way": ["x", "y", "x", "y", "x"], "MBps": [10.0, 200.0, 30.0, 400.0, 20.0]})
    fig, ax = plt.subplots()
    plt.close(fig)
    drawn = plots.medians_and_dots(ax, rows, "MBps", order=["y", "x"], colours={"x": "red"})
    assert drawn == ["y", "x"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["y", "x"]
    lines = [c for c in ax.collections if c.__class__.__name__ == "LineCollection"]
    medians_drawn = [seg[0][1] for c in lines for seg in c.get_segments()]
    assert medians_drawn == [300.0, 20.0]
    dots = [c for c in ax.collections if c.__class__.__name__ == "PathCollection"]
    assert [len(c.get_offsets()) for c in dots] == [2, 3]
    assert np.allclose(dots[1].get_facecolor()[0][:3], (1, 0, 0))
    assert [t.get_text() for t in ax.texts] == ["n=2", "n=3"]
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "log" and lo <= 10 / 1.5 and hi >= 800
    with pytest.raises(BadArgument):
        plots.medians_and_dots(ax, rows, "MBps", order=["z"])


def test_finish_labels_lab_figures_and_only_those():
    for lab in (True, False):
        fig, ax = plt.subplots()
        plt.close(fig)
        plots.finish(fig, lab=lab)
        assert [t.get_text() for t in fig.texts] == ([plots.LAB_NOTE] if lab else [])


def test_a_way_cannot_overwrite_the_columns_interleave_fills():
    with pytest.raises(BadArgument, match="'repeat', a column interleave fills itself"):
        interleave({"sly": lambda t: [{"seconds": 1.0}, {"repeat": 7}]}, 1)


def test_failed_rows_are_said_with_the_first_error_and_nothing_is_said_when_none_failed():
    from dataferry.harness.bench import say_failures

    said: list[str] = []
    rows = pd.DataFrame({"error": ["", "ConnectionResetError: peer reset", "", "TimeoutError"]})
    say_failures(rows, said.append)
    assert said == ["2 of 4 rows failed and are left out of the medians and figures, e.g.: "
                    "ConnectionResetError: peer reset"]
    say_failures(rows[rows["error"] == ""], said.append)
    say_failures(pd.DataFrame({"seconds": [1.0]}), said.append)
    assert len(said) == 1


def test_a_way_that_raises_stops_the_run_and_leaves_no_folder_behind(tmp_path):
    def broken(turn):
        (turn.folder / "half-written").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        interleave({"broken": broken}, 3, work_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_repeats_may_be_any_whole_number_type():
    assert len(interleave({"a": lambda t: None}, np.int64(2))) == 2


def test_two_calls_on_one_axes_share_its_limits_and_failed_or_non_positive_values_are_not_drawn():
    rows = pd.DataFrame({"knob": ["a", "b", "a", "b"], "first": [10.0, 20.0, 0.0, 30.0],
                         "again": [1000.0, 2000.0, 3000.0, 4000.0], "error": ["", "", "", "timeout"]})
    fig, ax = plt.subplots()
    plt.close(fig)
    plots.medians_and_dots(ax, rows, "first", by="knob", offset=-0.2, width=0.3, label="first", counts=False)
    plots.medians_and_dots(ax, rows, "again", by="knob", offset=0.2, width=0.3, label="again", counts=False)
    lo, hi = ax.get_ylim()
    assert lo <= 10 / 1.5 and hi >= 3000 * 2  # the second call widened the first's limits
    dots = [c for c in ax.collections if c.__class__.__name__ == "PathCollection"]
    assert [len(c.get_offsets()) for c in dots] == [1, 1, 2, 1]  # the 0 and the failed row are left out
    assert ax.get_legend_handles_labels()[1] == ["first", "again"]
    assert len(ax.texts) == 0
    fig, ax = plt.subplots()
    plt.close(fig)
    plots.medians_and_dots(ax, rows.assign(first=[-1.0, 2.0, 3.0, 4.0]), "first", by="knob", order=["c", "b", "a"],
                           log=False, label="c has no values: b carries the label")
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 3.0 * 1.25
    assert ax.get_legend_handles_labels()[1] == ["c has no values: b carries the label"]
