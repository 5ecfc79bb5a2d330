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
