"""The lessons' front door (Course.images, Course.folder, Course.keep): the same call in the lab and
elsewhere, tested against the real lab; the public path runs in the Colab rehearsal."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from dataferry.cache.counters import CacheStats
from dataferry.course import Course


@pytest.fixture
def course(tmp_path, lab, monkeypatch):
    monkeypatch.setenv("DATAFERRY_LAB_STATE", str(lab.state_dir))
    return Course("05_budget_and_verify", "lab", str(tmp_path / "results"), str(tmp_path / "figures"))


def test_images_in_the_lab_are_a_fresh_bucket_of_flowers_labelled_with_the_profile(course, lab):
    lab.create_bucket("l05-data").blob("train/stale/left-over.jpg").upload_from_string(b"x")
    data = course.images(10, seed=1, profile="same-continent")
    names = [e.name for e in data.entries]
    assert len(names) == 10 and names == sorted(names) and "stale/left-over.jpg" not in names
    assert {n.split("/")[0] for n in names} == {"daisy", "dandelion", "roses", "sunflowers", "tulips"}
    assert data.label == "lab:same-continent" and data.in_lab and "lab numbers" in str(data)
    assert data.bytes == sum(e.size for e in data.entries) > 0
    before = lab.profile.name
    with data.network() as crossed:
        assert crossed == "lab:same-continent" and lab.profile.name == "same-continent"
        assert data.source.fetch(data.entries[0], io.BytesIO()) == data.entries[0].size
    assert lab.profile.name == before
    assert data.lab_only("a fault") is True


def test_images_refuses_nothing_to_read(course):
    with pytest.raises(ValueError, match="at least one image"):
        course.images(0)


def test_a_folder_is_the_given_one_or_a_temporary_one_that_finish_removes(course, tmp_path):
    given = course.folder(str(tmp_path / "mine"), "cache")
    assert given == tmp_path / "mine"
    scratch = course.folder("", "cache")
    (scratch / "x").write_text("x")
    course.finish()
    assert not scratch.exists(), "the temporary folder is removed"
    assert course.folder(str(given), "cache") == given, "a given folder is never removed"


def test_keep_appends_rows_with_their_columns_and_time(course):
    path = course.keep([{"hits": 1}, {"hits": 2}], "05_budget/passes.csv", where="lab:colocated")
    course.keep([{"hits": 3}], "05_budget/passes.csv", where="lab:far")
    rows = pd.read_csv(path)
    assert list(rows["hits"]) == [1, 2, 3] and list(rows["where"]) == ["lab:colocated"] * 2 + ["lab:far"]
    assert rows["time_utc"].str.endswith("Z").all()


def test_keep_of_rows_with_other_columns_than_the_kept_ones_puts_each_value_under_its_own_column(course):
    """A rerun after an upgrade may keep rows with a column more, or the same columns in another order: appended
    as they are, values land under another column's header (or the CSV no longer reads). Every row keeps its
    values under their own names; a column a row lacks is empty."""
    path = course.keep([{"decoder": "pil", "au": 0.5, "epoch": 2}], "08_au/decoders.csv", fed="x")
    course.keep([{"au": 0.7, "epoch": 3, "decoder": "torchvision", "where": "lab:near", "workers": 2}],
                "08_au/decoders.csv", fed="y")
    course.keep([{"decoder": "torchcodec", "au": 0.9, "epoch": 4}], "08_au/decoders.csv", fed="z")
    rows = pd.read_csv(path)
    assert list(rows["decoder"]) == ["pil", "torchvision", "torchcodec"] and list(rows["au"]) == [0.5, 0.7, 0.9]
    assert list(rows["fed"]) == ["x", "y", "z"] and rows["where"].isna().tolist() == [True, False, True]
    assert rows["where"][1] == "lab:near" and rows["time_utc"].str.endswith("Z").all()
    lines = [line.split(",") for line in path.read_text().splitlines()]
    assert [line[lines[0].index("epoch")] for line in lines[1:]] == ["2", "3", "4"], "whole numbers stay whole"
    assert [line[lines[0].index("workers")] for line in lines[1:]] == ["", "2", ""], "whole numbers stay whole"


def test_keep_into_an_empty_file_writes_its_header_and_rows(course):
    path = course.results_dir / "05_budget" / "passes.csv"
    path.parent.mkdir(parents=True)
    path.write_text("")
    course.keep([{"hits": 1}], "05_budget/passes.csv")
    assert list(pd.read_csv(path)["hits"]) == [1] and not list(path.parent.glob("*.unreadable-*"))


def test_keep_sets_a_kept_csv_that_no_longer_reads_aside_says_so_and_starts_a_new_one(course):
    """An older version appended rows with a column more under the kept header: the file no longer reads. The
    lesson still keeps its rows: the unreadable file is moved aside whole (nothing in it changed) and said so in
    one line, and the rows start a new file."""
    path = course.results_dir / "08_au" / "decoders.csv"
    path.parent.mkdir(parents=True)
    damaged = "decoder,au\npil,0.5\ntorchvision,0.7,lab:near\n"
    path.write_text(damaged)
    with pytest.warns(UserWarning, match=r"08_au/decoders.csv does not read as a table .* kept as decoders.csv.unreadable-"):
        course.keep([{"decoder": "torchcodec", "au": 0.9}], "08_au/decoders.csv", fed="z")
    rows = pd.read_csv(path)
    assert list(rows["decoder"]) == ["torchcodec"] and list(rows["fed"]) == ["z"]
    aside = list(path.parent.glob("decoders.csv.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_text() == damaged


def test_cache_stats_subtract_to_what_happened_between():
    assert CacheStats(hits=5, misses=3, wait_s=1.5) - CacheStats(hits=2, misses=3, wait_s=0.5) == \
        CacheStats(hits=3, wait_s=1.0)


def test_lesson_10_stages_a_crash_and_a_disconnect_on_a_real_gcsfuse_mount(tmp_path, lab, monkeypatch):
    """A crash (the writer killed) tears torch.save's only checkpoint: gcsfuse uploads the half it was given. A
    disconnect (writer and gcsfuse killed) leaves the previous object: an unfinished upload changes nothing.
    Checkpoints' newest recorded save loads whole after both."""
    from dataferry.course.disconnect import CRASH, DISCONNECT, stage_failures

    monkeypatch.setenv("DATAFERRY_LAB_STATE", str(lab.state_dir))
    course = Course("10_checkpoints", "lab", str(tmp_path / "results"), str(tmp_path / "figures"))
    places = course.checkpoint_places(profile="unshaped")
    bucket = places.buckets["bucket"][0].removeprefix("gs://").split("/")[0]
    try:
        found = {(r["way"], r["failure"]): r["a restart finds"] for r in stage_failures(places, tmp_path)}
    finally:
        course.finish()
    assert found[("torch.save", CRASH)].startswith("the only checkpoint is torn")
    assert found[("torch.save", DISCONNECT)] == "the previous checkpoint, whole (the new one is lost)"
    assert found[("Checkpoints", CRASH)] == found[("Checkpoints", DISCONNECT)] == \
        "the newest recorded checkpoint (step 1), whole"
    assert bucket not in {b.name for b in lab.client(direct=True).list_buckets()}, "finish() deleted the bucket"
    assert not any(m.mounted for m in places.mounts.values()), "and unmounted the mount"


def test_the_pooled_runs_say_how_many_failed_read_and_training_epochs_they_leave_out():
    """Lesson 11 said "0 failed epochs left out" while it left out a failed training epoch: it counted only
    read epochs."""
    from dataferry.course.lessondata import failed_epochs

    rows = pd.DataFrame({"phase": ["epoch", "epoch", "train", "train", "read"],
                         "error": ["", "", "", "", "boom"]})
    assert failed_epochs(rows) == "0 failed read epochs, 0 failed training epochs"
    rows.loc[[1, 3], "error"] = "cuda out of memory"
    assert failed_epochs(rows) == "1 failed read epoch, 1 failed training epoch"
    rows.loc[[0, 2], "error"] = "timeout"
    assert failed_epochs(rows) == "2 failed read epochs, 2 failed training epochs"
