"""Lesson 01's front door (dataferry.course.lessondrive) when Colab grants Drive: the sample copied once, a later
runtime's first read a first read, Drive's rows labelled as Drive's. google.colab cannot run here, so a
stand-in module plays it (the one mock): its drive.mount makes a plain folder where Colab mounts Drive. The
public flowers come from the real lab, reached through STORAGE_EMULATOR_HOST as in the Colab rehearsal, which
runs the whole lesson with access refused."""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import pytest

from dataferry.course import Course
from dataferry.course.lessondrive import SAMPLE, drive_files

FLOWERS = "ai-platform/flowers/"


@pytest.fixture
def colab(monkeypatch, tmp_path, lab_env):
    """A Colab runtime: google.colab importable, Drive granted at ``tmp_path/drive``, the runtime's own /tmp."""
    mounts: list[bool] = []

    def mount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        mounts.append(readonly)
        (Path(mountpoint) / "MyDrive").mkdir(parents=True, exist_ok=True)

    colab, drive, files = (types.ModuleType(f"google.colab{m}") for m in ("", ".drive", ".files"))
    drive.mount, colab.drive = mount, drive
    files.download, colab.files = (lambda filename: None), files
    for module in (colab, drive, files):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    runtime = tmp_path / "runtime-1-tmp"
    runtime.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(runtime))
    monkeypatch.setenv("DATAFERRY_HOME", str(tmp_path / "home"))
    public = lab_env.create_bucket("cloud-samples-data")
    photos = {f"{FLOWERS}{kind}/{i}.jpg": f"{kind} {i}".encode() * 100 for kind in ("daisy", "roses") for i in range(3)}
    for name, data in photos.items():
        public.blob(name).upload_from_string(data)
    yield types.SimpleNamespace(mounts=mounts, photos=photos, point=tmp_path / "drive", monkeypatch=monkeypatch)
    for name in photos:
        public.blob(name).delete()


def test_drive_is_measured_in_colab_the_sample_copied_once(colab, tmp_path):
    course = Course("01_google_drive", "auto", str(tmp_path / "results"), str(tmp_path / "figures"))
    assert course.where == "public"
    first = drive_files(course, 3, 0, listing=5, seed=1, mountpoint=str(colab.point))
    sample = colab.point / "MyDrive" / SAMPLE
    assert first.is_drive and first.folder == sample and first.label.startswith("Google Drive, ")
    assert first.said == first.label, "Drive's rows are Drive's, not a stand-in's"
    assert colab.mounts == [False], "mounted writable, to copy the sample"
    assert [(sample / n).read_bytes() for n in first.names] == [colab.photos[n.removeprefix("files/")]
                                                                 for n in first.names]
    assert len(list((sample / first.listing).iterdir())) == 5
    assert not first.fresh and "copied there by this runtime" in str(first), "a file copied a minute ago is no first read"
    stamps = {n: (sample / n).stat().st_mtime_ns for n in first.names}

    again = drive_files(course, 3, 0, listing=5, seed=1, mountpoint=str(colab.point))
    assert again.names == first.names and not again.fresh, "the same runtime read them before"

    later_runtime = tmp_path / "runtime-2-tmp"
    later_runtime.mkdir()
    colab.monkeypatch.setattr(tempfile, "tempdir", str(later_runtime))
    later = drive_files(course, 3, 0, listing=5, seed=1, mountpoint=str(colab.point))
    assert later.fresh and "copied by an earlier runtime" in str(later)
    assert {n: (sample / n).stat().st_mtime_ns for n in later.names} == stamps, "nothing copied again"

    epochs = later.reads(tmp_path / "reads", repeats=2)
    epochs = epochs[epochs["phase"] == "epoch"].sort_values("pass")
    assert list(epochs["method"]) == ["drive"] * 3 and list(epochs["pass"]) == [1, 2, 2], "re-reads: repeats of pass 2"
    assert list(epochs["repeat"]) == [1, 1, 2]
    assert list(epochs["cache_state"]) == ["cold_unverified", "daemon_warm", "daemon_warm"], \
        "what Drive keeps cannot be seen: its first read is never called verified-cold"
    assert (epochs["bytes"] == sum(len(colab.photos[n.removeprefix("files/")]) for n in later.names)).all()

    assert later.first_listing_ns and again.first_listing_ns is None, "timed when found, in a runtime that had not"
    listed = later.listings(tmp_path / "listing", repeats=2)
    assert list(listed.loc[listed["pass"] == 1, "method"]) == ["os.scandir"], "Drive's first listing, once"
    assert listed.loc[listed["pass"] == 1, "ns"].iloc[0] == later.first_listing_ns
    assert sorted(listed.loc[listed["pass"] == 2, "method"]) == ["os.listdir + os.stat"] * 2 + ["os.scandir"] * 2
    assert (listed["file"] == "(5 entries)").all() and (listed["ms"] > 0).all()

    archives = later.archives(["zip"], course.folder("", "archive"), repeats=1)
    assert set(archives["way"]) == {"zip: copy + extract", "files through the mount"}
    assert len(list((sample / "archives").glob("*.zip"))) == 1 and not later.fresh, "the zip was written by this runtime"
    course.finish()


def test_your_own_drive_folder_is_read_where_it_is(colab, tmp_path):
    course = Course("01_google_drive", "auto", str(tmp_path / "results"), str(tmp_path / "figures"))
    mine = colab.point / "MyDrive" / "data" / "train"
    for kind in ("a", "b"):
        (mine / kind).mkdir(parents=True)
        for i in range(4 if kind == "b" else 2):
            (mine / kind / f"{i}.jpg").write_bytes(b"x" * 10)
    d = drive_files(course, 3, 0, folder=str(mine), seed=0, mountpoint=str(colab.point))
    assert d.folder == mine and d.listing == "b" and len(d.names) == 3 and d.fresh
    assert not (colab.point / "MyDrive" / SAMPLE).exists(), "no sample is copied when you name your folder"
    archives = d.archives(["tar"], course.folder("", "archive"), repeats=1)
    assert set(archives["way"]) == {"tar: copy + extract", "files through the mount"}
    assert not (mine / "archives").exists(), "nothing is written into your data"
    assert len(list((colab.point / "MyDrive" / SAMPLE / "archives").glob("*.tar"))) == 1
    course.finish()
    with pytest.raises(Exception, match="holds no files"):
        (mine / "empty").mkdir()
        drive_files(course, 3, 0, folder=str(mine / "empty"), mountpoint=str(colab.point))
