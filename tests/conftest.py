import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataferry.mounts import fuse_mounts_under, fuse_status

pytest_plugins = ["lab_fixtures"]

# What other libraries keep in the temp folder for a whole process (multiprocessing's pymp-*, torch's
# compile and elastic caches): not a leak of the code under test.
OTHERS_TEMP = ("pymp-", "torchinductor_", "torchelastic_")


@pytest.fixture(scope="session", autouse=True)
def system_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The system temp folder (``TMPDIR``, for this process and every process it starts: lessons'
    kernels, the CLI, workers) is a folder of this session's own, so that what a test leaves in it
    is seen (:func:`leaves_no_temp_files`) and nothing piles up in /tmp across runs."""
    tmp_path_factory.getbasetemp()  # pytest's own temp folders stay where they are
    folder = Path(tempfile.mkdtemp(prefix="dataferry-tests-"))
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    try:
        yield folder
        # what module- and session-wide fixtures (the course run, the bench run, the lab) left behind
        left = [n for n in os.listdir(folder) if not n.startswith(OTHERS_TEMP)]
        assert not left, f"left in the system temp folder at the end of the session: {', '.join(sorted(left))}"
    finally:
        tempfile.tempdir = None
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        if not fuse_mounts_under(folder):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def leaves_no_temp_files(system_temp: Path) -> Iterator[None]:
    """A test, and the package code it runs, removes what it made in the system temp folder: a lesson
    or a benchmark that leaves a cache there fills a Colab runtime's disk run after run."""
    before = set(os.listdir(system_temp))
    yield
    left = sorted(n for n in set(os.listdir(system_temp)) - before if not n.startswith(OTHERS_TEMP))
    for name in left:
        path = system_temp / name
        if fuse_mounts_under(path):
            continue  # never walk into a mount: removing its files would delete objects in a bucket
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    assert not left, f"left in the system temp folder: {', '.join(left)}"


@pytest.fixture
def gcsfuse_lab(lab):
    """The session lab with gcsfuse. Skips only on a machine without usable /dev/fuse; a gcsfuse
    that failed to build is an error, not a skip."""
    g = lab.status()["gcsfuse"]
    if not g["available"]:
        ok, why = fuse_status()
        if not ok:
            pytest.skip(f"no FUSE on this machine: {why}")
        pytest.fail(f"gcsfuse unavailable: {g['why']}")
    return lab


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """A machine with no Google credentials at all (as a Colab notebook before its sign-in cell): no
    key file, no gcloud login, no metadata server, no emulator. Child processes inherit it."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
