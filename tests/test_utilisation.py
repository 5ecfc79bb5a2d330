"""Accelerator utilisation of each course method, in the lab: real DataLoader workers, real servers."""

import pytest

pytest.importorskip("torch")

from dataferry.course.lab.methodsbench import lab_target  # noqa: E402
from dataferry.harness.feed import ComputeProfile  # noqa: E402
from dataferry.harness.runtime import detect_region  # noqa: E402
from dataferry.harness.results import Results, load_results  # noqa: E402
from dataferry.harness.utilisation import AU_METHODS, au_table, compare_au  # noqa: E402


def test_every_method_feeds_epochs_and_only_the_local_ones_keep_a_far_accelerator_busy(gcsfuse_lab, tmp_path):
    lab = gcsfuse_lab
    target = lab_target(lab, "au-methods", 24, 64 << 10, seed=3, work=tmp_path / "target")
    # 4 ms of compute per batch of 8: local files keep up easily; one far round trip per sample cannot.
    profile = ComputeProfile("test-fast", "none", "sleep", 2000, 8, "this test")
    with lab.using_profile("cross-continent"), Results(tmp_path / "out") as results:
        compare_au(target, results, AU_METHODS, profile, region=detect_region(lab_profile="cross-continent"),
                   runtime_kind="cpu", epochs=2, repeats=1, batch_size=8, workers=2, seed=1, work=tmp_path)
    rows = load_results(tmp_path / "out")
    assert (rows["error"] == "").all(), rows[rows["error"] != ""]["error"].tolist()
    assert sorted(rows["method"].unique()) == sorted(AU_METHODS)
    assert (rows["phase"] == "train").all() and (rows["samples"] == 24).all()
    assert (rows["region"] == "lab:cross-continent").all() and (rows["compute_profile"] == "test-fast").all()
    au = {(m, e): a for m, e, a in zip(rows["method"], rows["pass"], rows["au"])}
    assert all(0 < a <= 1 for a in au.values())
    # The remote is paid every epoch without a cache, once with one.
    assert au[("api", 2)] < 0.5 * au[("cache", 2)] and au[("api", 2)] < 0.5 * au[("stage", 2)]
    assert au[("gcsfuse", 2)] < 0.5 * au[("gcsfuse-cache", 2)]
    assert au[("cache", 2)] > au[("cache", 1)] and au[("stage", 2)] > au[("stage", 1)]
    state = {(m, e): s for m, e, s in zip(rows["method"], rows["pass"], rows["cache_state"])}
    assert state[("stage", 1)] == "cold_verified" and state[("stage", 2)] == "local_copy"
    assert state[("gcsfuse-cache", 2)] == "daemon_warm"
    assert {r for (m, _), r in zip(zip(rows["method"], rows["pass"]), rows["bound_by"]) if m == "api"} == {"loader"}
    table = au_table(rows)
    assert "| 24 | 64 KiB | lab:cross-continent | cpu | test-fast | api | 2 | cold_verified |" in table, table
    assert "| 24 | 64 KiB | lab:cross-continent | cpu | test-fast | stage | 2 | local_copy |" in table, table


def test_the_au_table_never_pools_two_lessons_two_sample_counts_or_two_cache_states():
    import pandas as pd

    def rows(lesson, samples, au, state="cold_verified"):
        return pd.DataFrame({"phase": "train", "error": "", "region": "lab:near", "compute_profile": "p", "method": "cache",
                             "pass": 1, "file": f"({samples} samples)", "samples": samples, "bytes": samples * 65536,
                             "ns": 10**9, "au": au, "bound_by": "loader", "lesson": lesson, "runtime": "cpu",
                             "cache_state": state}, index=range(3))

    table = au_table(pd.concat([rows("08_will_my_gpu_starve", 128, 0.2), rows("08_will_my_gpu_starve", 16, 0.9),
                                rows("bench", 128, 0.5), rows("bench", 128, 0.7, "local_copy")],
                               ignore_index=True)).splitlines()
    assert table[0].startswith("| lesson | samples | sample size | region | runtime |") and len(table) == 2 + 4, table
    assert "| epoch | cache state | AU median" in table[0], table
    assert "| 08 | 16 | 64 KiB | lab:near | cpu | p | cache | 1 | cold_verified | 90.0% (90-90%) | 3 | 16 | loader |" in table, \
        "a lesson by its number"
    assert "| bench | 128 | 64 KiB | lab:near | cpu | p | cache | 1 | local_copy | 70.0% (70-70%) | 3 | 128 | loader |" in table


def test_the_au_table_gives_tenths_so_that_an_au_just_under_a_threshold_never_reads_as_on_it():
    """Lesson 08's table printed gcsfuse-cache's later epochs at "90% (90%-91%)" beside a verdict that they ran at
    89.9%, under MLPerf's 90%."""
    import pandas as pd

    rows = pd.DataFrame({"phase": "train", "error": "", "region": "lab:near", "compute_profile": "p", "method": "cache",
                         "pass": 2, "samples": 16, "bytes": 16 * 65536, "ns": 10**9, "au": [0.8992, 0.8986, 0.9071],
                         "bound_by": "compute", "runtime": "cpu", "cache_state": "local_copy"})
    assert "| local_copy | 89.9% (89-91%) | 3 |" in au_table(rows), "the range rounded outward, the median to a tenth"


@pytest.mark.parametrize("recorded", [True, False])
def test_the_au_table_of_rows_that_name_no_cache_state_says_so(recorded):
    """Rows with an empty cache state, or an older schema without the column, are said not to record it."""
    import pandas as pd

    rows = pd.DataFrame({"phase": "train", "error": "", "region": "lab:near", "compute_profile": "p", "method": "cache",
                         "pass": 1, "samples": 16, "bytes": 16 * 65536, "ns": 10**9, "au": 0.5, "bound_by": "loader",
                         "runtime": "cpu", "cache_state": None}, index=range(2))
    if not recorded:
        rows = rows.drop(columns="cache_state")
    assert "| 16 | 64 KiB | lab:near | cpu | p | cache | 1 | not recorded | 50.0% (50-50%) | 2 |" in au_table(rows)


def test_lesson_08s_real_model_run_has_a_steady_state_at_the_lessons_defaults(tmp_path, monkeypatch):
    """On a GPU runtime lesson 08 trains a real model through the cache at the lesson's own batch size, so that with
    its defaults every epoch runs past the pipeline's fill and has a steady AU (at batch 64, its 192 files made 3
    steps an epoch, all fill: NaN). No GPU here: a small model trains on the CPU, the one part replaced."""
    import os
    from pathlib import Path
    from types import SimpleNamespace

    import papermill
    import torch

    from dataferry import LocalSource
    from dataferry.course import lessonau
    from dataferry.harness import feed

    lesson = Path(__file__).parents[1] / "notebooks" / "08_will_my_gpu_starve.ipynb"
    params = {k: eval(v["default"], {}) for k, v in papermill.inspect_notebook(str(lesson)).items()}
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(params["N_FILES"]):
        (folder / f"{i:04d}.bin").write_bytes(os.urandom(params["FILE_BYTES"]))
    on_the_cpu = feed.TorchCompute
    monkeypatch.setattr(lessonau, "cuda", lambda real="auto": real != "no")
    # a small model with steady work per step (a model of almost none times its steps too unevenly for a steady AU)
    tiny = torch.nn.Sequential(torch.nn.AvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(3 * 112 * 112, 1000))
    monkeypatch.setattr(feed, "TorchCompute", lambda model, **kw: on_the_cpu(tiny, device="cpu"))
    data = lessonau.AUData(SimpleNamespace(source=LocalSource(folder)), [(None, detect_region())], [], tmp_path / "work",
                           "")
    rows = lessonau.real_gpu(data, feed.PROFILES["resnet50-v100-fp32"], epochs=params["EPOCHS"],
                             workers=params["NUM_WORKERS"], batch_size=params["BATCH_SIZE"])
    assert len(rows) == 2 * params["EPOCHS"] and rows["steady AU"].notna().all(), rows.to_string()
    # each epoch says where it ran and what it started from: an empty cache, then the copies with their pages dropped
    assert (rows["where"] == detect_region().region).all()
    assert list(rows["cache state"][rows["epoch"] == 1]) == ["cold_verified"] * 2
    assert set(rows["cache state"][rows["epoch"] > 1]) <= {"local_copy", "cold_unverified", "page_warm"}, rows


@pytest.mark.parametrize("dropped, later", [("cold_verified", "local_copy"), ("cold_unverified", "cold_unverified"),
                                            ("page_warm", "page_warm")])
def test_a_later_epoch_through_the_cache_is_a_local_copy_only_when_its_page_cache_drop_was_verified(dropped, later):
    """Epoch 1 of stage and cache starts from an empty cache; a later one reads the local copies, and says what the
    drop of their pages left (MEASUREMENT.md rule 2): pages still resident are not a cold local copy."""
    from dataferry.harness.utilisation import epoch_state

    for method in ("stage", "cache"):
        assert (epoch_state(method, 1, dropped), epoch_state(method, 2, dropped)) == ("cold_verified", later)
    # gcsfuse's file cache likewise: warm only where the drop of the files' pages was verified
    assert epoch_state("gcsfuse-cache", 2, dropped) == ("daemon_warm" if dropped == "cold_verified" else dropped)
