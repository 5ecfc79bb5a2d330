import pytest

from dataferry.mounts import fuse_status

pytest_plugins = ["dataferry.lab.fixtures"]


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
