"""dataferry.course: which data a lesson reads (WHERE), where its results go, what its setup installs.

Colab is detected through the stand-in ``google.colab`` of test_colab.py (the project's one mock);
the buckets are real lab buckets, reached through STORAGE_EMULATOR_HOST as Colab reaches GCS.
"""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

import pytest

from dataferry import course as course_mod
from dataferry.course import (
    PUBLIC_DATASETS,
    Course,
    bucket_location,
    course_home,
    install_requirement,
    resolve_where,
    shipped_results,
)
from test_colab import FakeColab, install

ROOT = Path(__file__).resolve().parents[1]
REPO = tomllib.loads((ROOT / "helpers" / "pyproject.toml").read_text())["project"]["urls"]["Source"]


@pytest.fixture
def outside(monkeypatch):
    for name in ("google.colab", "google.colab.drive", "google.colab.auth", "google.colab.files"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    for var in ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION", "DATAFERRY_HOME"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def colab(monkeypatch, tmp_path):
    """In Colab, with /content (and Drive's mount point) in a temporary folder."""
    monkeypatch.delenv("DATAFERRY_HOME", raising=False)
    monkeypatch.setattr(course_mod, "COLAB_CONTENT", tmp_path / "content")
    monkeypatch.setattr(course_mod, "COLAB_DRIVE", tmp_path / "content" / "drive" / "MyDrive")
    fake = install(monkeypatch, FakeColab())
    downloads = []
    files = __import__("types").ModuleType("google.colab.files")
    files.download = downloads.append
    fake.colab.files = files
    monkeypatch.setitem(__import__("sys").modules, "google.colab.files", files)
    fake.downloads = downloads
    return fake


def test_where_is_the_lab_off_colab_and_the_public_data_in_colab(outside, monkeypatch):
    assert resolve_where("auto") == "lab" and resolve_where("") == "lab"
    assert resolve_where("Public") == "public" and resolve_where("mine") == "mine"
    with pytest.raises(ValueError, match=r"WHERE = 'cloud': choose one of 'auto', 'lab', 'public', 'mine'"):
        resolve_where("cloud")
    install(monkeypatch, FakeColab())
    assert resolve_where("auto") == "public"
    assert resolve_where("lab") == "lab"


def test_install_requirement_is_the_source_url_unless_overridden(monkeypatch):
    monkeypatch.delenv("DATAFERRY_INSTALL", raising=False)
    assert install_requirement() == f"dataferry @ git+{REPO}#subdirectory=helpers"
    monkeypatch.setenv("DATAFERRY_INSTALL", "/wheels/dataferry-0.1.0-py3-none-any.whl")
    assert install_requirement() == "/wheels/dataferry-0.1.0-py3-none-any.whl"


def test_results_go_home_off_colab_never_relative_to_the_notebook(outside, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    c = Course("03_gcs_client", "lab")
    assert c.results_dir == tmp_path / "home" / "dataferry" / "results"
    assert c.figures_dir == tmp_path / "home" / "dataferry" / "figures" and c.figures_dir.is_dir()
    given = Course("03_gcs_client", "lab", "rel/results", str(tmp_path / "figs"))
    assert given.results_dir == tmp_path / "rel" / "results", "a relative folder given is made absolute at once"
    archive = given.finish()
    assert archive.parent == tmp_path / "rel" / "downloads", "the zip lies next to the results it holds, not in home"
    assert not (tmp_path / "home" / "dataferry" / "downloads").exists()
    monkeypatch.setenv("DATAFERRY_HOME", str(tmp_path / "elsewhere"))
    assert course_home() == (tmp_path / "elsewhere", "$DATAFERRY_HOME")


def test_the_lesson_says_why_its_folders_are_where_they_are_only_for_those_it_chose(outside, monkeypatch, tmp_path):
    """Folders passed in (papermill, ``make course``) are the caller's choice: the lesson says so, and names
    its home folder's reason only for a folder that follows it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    chosen = Course("03_gcs_client", "lab").describe()
    assert "(your home folder)" in chosen and "as passed in" not in chosen
    both = Course("03_gcs_client", "lab", str(tmp_path / "r"), str(tmp_path / "f")).describe()
    assert "home folder" not in both and "both as passed in" in both, both
    one = Course("03_gcs_client", "lab", str(tmp_path / "r")).describe()
    assert "RESULTS_DIR as passed in" in one and "figures under" in one and "your home folder" in one, one


def test_in_colab_results_go_to_a_writable_drive_else_to_content_with_a_download(colab, tmp_path):
    home, why = course_home()
    assert home == tmp_path / "content" / "dataferry" and "deleted at disconnect" in why
    c = Course("02_gcsfuse")
    assert c.where == "public"
    (c.results_dir / "02_gcsfuse").mkdir()
    (c.results_dir / "02_gcsfuse" / "results.csv").write_text("run_id\nx\n")
    archive = c.finish()
    assert colab.downloads == [str(archive)], "the zip is offered to the browser"
    assert "results/02_gcsfuse/results.csv" in zipfile.ZipFile(archive).namelist()

    drive = tmp_path / "content" / "drive" / "MyDrive"
    drive.mkdir(parents=True)
    home, why = course_home()
    assert home == drive / "dataferry" and "outlives this runtime" in why
    assert Course("02_gcsfuse").finish() is None and len(colab.downloads) == 1, "nothing to download from Drive"


def test_in_colab_keep_on_drive_mounts_drive_writable_once_and_a_later_lesson_finds_the_results(colab, tmp_path):
    """Each lesson's badge opens a runtime of its own: KEEP_ON_DRIVE puts the course folder on Drive, so the
    analysis lesson, in another runtime, finds what the earlier ones measured. The default never touches Drive."""
    assert Course("02_gcsfuse").home == tmp_path / "content" / "dataferry" and colab.mount_calls == []
    drive = tmp_path / "content" / "drive" / "MyDrive"
    first = Course("02_gcsfuse", keep_on_drive=True)
    assert [(args, kw["readonly"]) for args, kw in colab.mount_calls] == [((str(drive.parent),), False)]
    assert first.home == drive / "dataferry" and "outlives this runtime" in first.describe()
    (first.results_dir / "02_gcsfuse").mkdir()
    (first.results_dir / "02_gcsfuse" / "results.csv").write_text("run_id\nx\n")
    later = Course("11_analysis", keep_on_drive=True)
    assert len(colab.mount_calls) == 1, "a Drive already mounted writable is used as it is"
    assert (later.results_dir / "02_gcsfuse" / "results.csv").read_text() == "run_id\nx\n"
    assert later.finish() is None and colab.downloads == [], "nothing to download from Drive"


def test_in_colab_keep_on_drive_refused_still_runs_the_lesson_on_the_runtimes_disk(colab, tmp_path):
    def refuse(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        colab.mount_calls.append(((mountpoint,), {"readonly": readonly}))
        raise ValueError("mount failed: access was not granted")  # what drive.mount raises when access is refused

    colab.drive.mount = refuse
    c = Course("02_gcsfuse", keep_on_drive=True)
    assert len(colab.mount_calls) == 1 and c.home == tmp_path / "content" / "dataferry"
    assert "Drive could not be mounted" in c.describe() and "access was not granted" in c.describe()


def test_public_data_is_read_anonymously_through_the_emulator_variable(outside, lab_env, monkeypatch, tmp_path):
    flowers = PUBLIC_DATASETS["flowers"]
    bucket = lab_env.create_bucket(flowers.bucket)
    bucket.blob(f"{flowers.prefix}daisy/1_a.jpg").upload_from_string(b"x" * 1000)
    monkeypatch.setenv("DATAFERRY_HOME", str(tmp_path))
    data = Course("04_stage_to_local_disk", "public").cloud_data()
    assert data.anonymous and data.uri == "gs://cloud-samples-data/ai-platform/flowers/"
    assert type(data.client._credentials).__name__ == "AnonymousCredentials"
    assert [b.name for b in data.client.list_blobs(data.bucket, prefix=data.prefix)] == [f"{flowers.prefix}daisy/1_a.jpg"]
    assert data.location_source == "bucket metadata", "the lab's bucket answers metadata reads"
    with pytest.raises(ValueError, match=r"WHERE = 'mine' reads your own bucket: set BUCKET"):
        Course("04_stage_to_local_disk", "mine").cloud_data()
    with pytest.raises(ValueError, match=r"no public data set 'imagenet'"):
        Course("04_stage_to_local_disk", "public").cloud_data(dataset="imagenet")


def test_bucket_location_says_how_it_was_found(lab):
    client = lab.client()
    assert bucket_location(client, "no-such-bucket-here") == ("unknown", "not readable here (NotFound) and not documented")
    assert bucket_location(client, "no-such-bucket-here", "US") == ("US", "documented (metadata not readable: NotFound)")


def test_public_data_sets_say_where_google_documents_them():
    for data in PUBLIC_DATASETS.values():
        assert data.documented_at.startswith("https://cloud.google.com/")
        assert data.prefix.endswith("/") and data.suffix.startswith(".")


def test_shipped_runs_are_package_data():
    folder = shipped_results()
    assert folder.is_dir() and (folder / "README.md").exists()
    assert folder.parent.parent == Path(course_mod.__file__).parent and folder.parent.name == "data"


def test_show_table_leaves_missing_values_blank_and_formats_the_rest(capsys):
    """A table with a step some ways do not have shows an empty cell, never 'nan', to the learner."""
    import pandas as pd

    from dataferry.course import show_table

    show_table(pd.DataFrame({"way": ["zip", "stage"], "extract_s": [0.00443, float("nan")]}), index=False,
               floatfmt=".3g")
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert [[cell.strip() for cell in row] for row in rows] == [["zip", "0.00443"], ["stage", ""]]


def test_your_own_bucket_without_credentials_says_how_to_sign_in(outside, no_credentials):
    """WHERE = 'mine' off Colab with no credentials: one message that says how to sign in, not
    google-auth's DefaultCredentialsError."""
    from dataferry.sources import NoCredentials

    with pytest.raises(NoCredentials, match=r"no Google credentials found to read your bucket\. In Colab, run "
                                            r"dataferry\.mounts\.authenticate\(\)"):
        Course("04_stage_to_local_disk", "mine").cloud_data(bucket="my-data")
