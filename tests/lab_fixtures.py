"""pytest fixtures for code that needs the lab. Enable with ``pytest_plugins = ["lab_fixtures"]``.

- ``lab``: a running lab for the whole session, in its own state folder (it never touches a lab
  you started by hand), stopped at the end;
- ``lab_bucket``: a fresh, empty bucket per test, deleted after it; the lab's profile is reset
  to ``unshaped`` after the test so that shaping never leaks into the next one;
- ``lab_env``: the lab, with ``STORAGE_EMULATOR_HOST`` pointing at it for this test (and the
  processes it starts), so code that makes its own google-cloud-storage client reaches the lab.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dataferry.course.lab.core import Lab


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A running lab shared by the session's tests."""
    lab = Lab(state_dir=tmp_path_factory.mktemp("lab-state")).up()
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def lab_bucket(lab: Lab):
    """A new empty lab bucket (a google-cloud-storage ``Bucket`` on the direct endpoint)."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    bucket = lab.create_bucket(name)
    try:
        yield bucket
    finally:
        lab.set_profile("unshaped")
        lab.delete_bucket(name)


@pytest.fixture
def lab_env(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """The session lab, with its endpoint in the environment for the duration of the test."""
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    return lab
