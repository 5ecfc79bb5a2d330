"""The Colab helpers in dataferry.mounts: in_colab, authenticate, mount_drive, install_gcsfuse.

This file holds the only mock in this project: google.colab cannot run outside Colab, so the
tests put a stand-in ``google.colab`` package (``drive`` and ``auth``) into ``sys.modules`` that
records its calls. Everything else is real: real folders, real listings, real subprocesses.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import google
import pytest

from dataferry import mounts
from dataferry.mounts import colab as colab_helpers
from dataferry.mounts import (
    MountError,
    NotInColab,
    authenticate,
    in_colab,
    install_gcsfuse,
    mount_drive,
)

COLAB_ENV = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION")


class FakeColab:
    """The stand-in google.colab: records drive.mount and auth.authenticate_user calls.

    ``make_drive`` says on which mount call (1-based; 0: never) the stand-in creates
    ``<mountpoint>/MyDrive`` with a file in it, as Drive's FUSE daemon would.
    """

    def __init__(self, make_drive: int = 1) -> None:
        self.make_drive = make_drive
        self.mount_calls: list[tuple[tuple, dict]] = []
        self.auth_calls = 0
        self.colab = types.ModuleType("google.colab")
        self.drive = types.ModuleType("google.colab.drive")
        self.auth = types.ModuleType("google.colab.auth")
        self.drive.mount = self._mount
        self.auth.authenticate_user = self._authenticate_user
        self.colab.drive = self.drive
        self.colab.auth = self.auth

    def _mount(self, mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        self.mount_calls.append(
            ((mountpoint,), {"force_remount": force_remount, "timeout_ms": timeout_ms, "readonly": readonly})
        )
        if len(self.mount_calls) == self.make_drive:
            my_drive = Path(mountpoint) / "MyDrive"
            my_drive.mkdir(parents=True, exist_ok=True)
            (my_drive / "notes.txt").write_text("hello from Drive\n")

    def _authenticate_user(self) -> None:
        self.auth_calls += 1


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeColab) -> FakeColab:
    """Put the stand-in into sys.modules next to the real ``google`` namespace package."""
    monkeypatch.setitem(sys.modules, "google.colab", fake.colab)
    monkeypatch.setitem(sys.modules, "google.colab.drive", fake.drive)
    monkeypatch.setitem(sys.modules, "google.colab.auth", fake.auth)
    monkeypatch.setattr(google, "colab", fake.colab, raising=False)
    return fake


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain machine: no google.colab imported, no Colab environment variables."""
    for name in ("google.colab", "google.colab.drive", "google.colab.auth"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for var in COLAB_ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def colab(monkeypatch: pytest.MonkeyPatch) -> FakeColab:
    monkeypatch.setattr(colab_helpers, "_BACKOFF_S", 0.0)
    return install(monkeypatch, FakeColab())


# -- outside Colab ---------------------------------------------------------------------------


def test_not_in_colab_is_a_runtime_error():
    assert issubclass(NotInColab, RuntimeError)
    assert "NotInColab" in mounts.__all__ and "mount_drive" in mounts.__all__


def test_outside_colab_every_helper_says_what_to_do_instead(outside, tmp_path):
    assert in_colab() is False
    with pytest.raises(NotInColab, match=r"gcloud auth application-default login.*GOOGLE_APPLICATION_CREDENTIALS"):
        authenticate()
    with pytest.raises(NotInColab, match=r"only works in Colab.*lab's Drive stand-in"):
        mount_drive(str(tmp_path / "drive"))
    assert not (tmp_path / "drive").exists()
    with pytest.raises(NotInColab, match=r"install guide.*dataferry lab build"):
        install_gcsfuse(distribution="jammy", run=lambda cmd: pytest.fail(f"ran {cmd} outside Colab"))


def test_in_colab_needs_an_importable_google_colab_and_a_colab_variable(outside, monkeypatch, tmp_path):
    package = tmp_path / "google" / "colab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert importlib.util.find_spec("google.colab") is not None
    assert in_colab() is False  # importable, but no Colab runtime variable
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20240101-060000_RC00")
    assert in_colab() is True
    assert "google.colab" not in sys.modules  # detection must not import it


def test_importing_mounts_does_not_import_google_colab():
    code = "import dataferry.mounts, sys; assert 'google.colab' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- with the stand-in -----------------------------------------------------------------------


def test_in_colab_and_authenticate(colab):
    assert in_colab() is True
    authenticate()
    assert colab.auth_calls == 1


def test_mount_drive_mounts_read_only_and_lists_my_drive(colab, tmp_path):
    point = tmp_path / "drive"
    result = mount_drive(mountpoint=str(point))
    assert colab.mount_calls == [
        ((str(point),), {"force_remount": False, "timeout_ms": 120000, "readonly": True}),
    ]
    assert result == point / "MyDrive"
    assert (result / "notes.txt").read_text() == "hello from Drive\n"


def test_mount_drive_passes_readonly_and_timeout_through(colab, tmp_path):
    point = tmp_path / "drive"
    mount_drive(mountpoint=str(point), readonly=False, timeout_s=30)
    assert colab.mount_calls == [
        ((str(point),), {"force_remount": False, "timeout_ms": 30000, "readonly": False}),
    ]


def test_mount_drive_without_warm_up_returns_the_mount_point(colab, tmp_path):
    point = tmp_path / "drive"
    assert mount_drive(mountpoint=str(point), warm_up=None) == point
    assert len(colab.mount_calls) == 1


def test_a_healthy_existing_mount_is_not_remounted(colab):
    # /proc is a real mount point that answers a listing: it stands for a Drive mount that works.
    if not mounts.is_mounted("/proc"):
        pytest.skip("/proc is not a mount point here")
    assert mount_drive(mountpoint="/proc", warm_up=None) == Path("/proc")
    assert colab.mount_calls == []


def test_a_broken_existing_mount_is_remounted(colab, gcsfuse_lab, lab_bucket, tmp_path):
    """A real "Transport endpoint is not connected": a FUSE daemon (the lab's gcsfuse) SIGKILLed
    under its mount, as Drive's is when the runtime runs out of memory. The stand-in's remount
    clears the dead mount and mounts again, as drive.mount(force_remount=True) does."""
    point = tmp_path / "drive"
    lab_bucket.blob("MyDrive/notes.txt").upload_from_string(b"hello")
    dead = gcsfuse_lab.mount(lab_bucket.name, mountpoint=point)
    os.kill(dead.pid, signal.SIGKILL)
    dead.process.wait()
    with pytest.raises(OSError) as broken:
        os.listdir(point)
    assert broken.value.errno == errno.ENOTCONN

    def remount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        colab.mount_calls.append(((mountpoint,), {"force_remount": force_remount}))
        subprocess.run(["umount", "-l", mountpoint], check=True)
        colab.fresh = gcsfuse_lab.mount(lab_bucket.name, mountpoint=mountpoint)

    colab.drive.mount = remount
    try:
        assert mount_drive(mountpoint=str(point)) == point / "MyDrive"
        assert [kw["force_remount"] for _, kw in colab.mount_calls] == [True]
        assert (point / "MyDrive" / "notes.txt").read_bytes() == b"hello"
    finally:
        colab.fresh.unmount()


def failing_scandir(monkeypatch, target: Path, failures: int, err: int) -> list[str]:
    """Make os.scandir raise ``err`` for ``target`` the first ``failures`` times; returns the log.

    Drive's "Transport endpoint is not connected" cannot happen without Drive's FUSE daemon, so
    this injects it. os.scandir is patched for this test only and lists every path for real
    except ``target`` while failures are left.
    """
    real_scandir = os.scandir
    seen: list[str] = []

    def scandir(path="."):
        if os.fspath(path) == str(target):
            seen.append(str(path))
            if len(seen) <= failures:
                raise OSError(err, os.strerror(err), os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(colab_helpers.os, "scandir", scandir)
    return seen


def test_warm_up_remounts_once_on_enotconn_and_succeeds(colab, monkeypatch, tmp_path):
    point = tmp_path / "drive"
    seen = failing_scandir(monkeypatch, point / "MyDrive", failures=1, err=errno.ENOTCONN)
    result = mount_drive(mountpoint=str(point))
    assert result == point / "MyDrive"
    assert len(seen) == 2
    assert [kw["force_remount"] for _, kw in colab.mount_calls] == [False, True]


def test_warm_up_retries_a_folder_that_appears_late(monkeypatch, tmp_path):
    # MyDrive shows up only after the remount: the first listing fails with ENOTCONN, for real
    # there is no MyDrive yet, and the second mount call creates it.
    monkeypatch.setattr(colab_helpers, "_BACKOFF_S", 0.0)
    fake = install(monkeypatch, FakeColab(make_drive=2))
    point = tmp_path / "drive"
    failing_scandir(monkeypatch, point / "MyDrive", failures=1, err=errno.ENOTCONN)
    assert mount_drive(mountpoint=str(point)) == point / "MyDrive"
    assert [kw["force_remount"] for _, kw in fake.mount_calls] == [False, True]


def test_warm_up_gives_up_after_retries_with_advice(monkeypatch, tmp_path):
    monkeypatch.setattr(colab_helpers, "_BACKOFF_S", 0.0)
    fake = install(monkeypatch, FakeColab(make_drive=0))  # MyDrive never appears
    point = tmp_path / "drive"
    seen = failing_scandir(monkeypatch, point / "MyDrive", failures=0, err=errno.ENOTCONN)
    with pytest.raises(MountError, match=r"failed 4 time\(s\).*Disconnect and delete runtime") as info:
        mount_drive(mountpoint=str(point), retries=4)
    assert "flush_and_unmount" in str(info.value)
    assert len(seen) == 4
    assert [kw["force_remount"] for _, kw in fake.mount_calls] == [False]  # ENOENT: no remount


def test_warm_up_remounts_only_once_when_enotconn_persists(colab, monkeypatch, tmp_path):
    point = tmp_path / "drive"
    seen = failing_scandir(monkeypatch, point / "MyDrive", failures=99, err=errno.ENOTCONN)
    with pytest.raises(MountError, match="Disconnect and delete runtime"):
        mount_drive(mountpoint=str(point))
    assert len(seen) == 3
    assert [kw["force_remount"] for _, kw in colab.mount_calls] == [False, True]


def test_a_failing_drive_mount_becomes_a_mount_error(colab, tmp_path):
    def refuse(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        raise ValueError("mount failed")

    colab.drive.mount = refuse
    with pytest.raises(MountError, match=r"mount failed.*Disconnect and delete runtime") as info:
        mount_drive(mountpoint=str(tmp_path / "drive"))
    assert isinstance(info.value.__cause__, ValueError)


# -- install_gcsfuse -------------------------------------------------------------------------


def fake_gcsfuse(folder: Path) -> None:
    """An executable that answers ``--version`` like gcsfuse does (what apt-get would install)."""
    exe = folder / "gcsfuse"
    exe.write_text("#!/bin/sh\necho 'gcsfuse version 2.4.0 (Go version go1.22.4)'\necho second line\n")
    exe.chmod(0o755)


def test_install_gcsfuse_uses_a_signed_by_keyring(colab, monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    commands: list = []

    def run(cmd):
        commands.append(cmd)
        if cmd[:2] == ["apt-get", "install"]:
            fake_gcsfuse(bin_dir)

    version = install_gcsfuse(distribution="jammy", run=run)
    assert version == "gcsfuse version 2.4.0 (Go version go1.22.4)"
    assert commands and all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in commands)
    text = [" ".join(c) for c in commands]
    keyring = [t for t in text if "gpg --batch --yes --dearmor" in t or "gpg --dearmor" in t]
    assert len(keyring) == 1 and f"{mounts.GCSFUSE_APT_REPO}/doc/apt-key.gpg" in keyring[0]
    assert "pipefail" in keyring[0]
    sources = [t for t in text if "signed-by=" in t]
    assert len(sources) == 1
    assert "gcsfuse-jammy main" in sources[0] and "/etc/apt/sources.list.d/gcsfuse.list" in sources[0]
    assert ["apt-get", "update", "-q"] in commands
    assert commands[-1] == ["apt-get", "install", "-y", "-q", "gcsfuse"]
    assert text.index(keyring[0]) < text.index(sources[0]) < text.index("apt-get update -q")
    assert not any("apt-key add" in t for t in text)


def test_install_gcsfuse_skips_installing_when_gcsfuse_is_on_path(colab, monkeypatch, tmp_path):
    fake_gcsfuse(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    commands: list = []
    assert install_gcsfuse(distribution="jammy", run=commands.append).startswith("gcsfuse version 2.4.0")
    assert commands == []


def test_install_gcsfuse_reports_a_gcsfuse_missing_after_install(colab, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    commands: list = []
    with pytest.raises(MountError, match="not on PATH"):
        install_gcsfuse(distribution="noble", run=commands.append)
    assert any("gcsfuse-noble main" in " ".join(c) for c in commands)


def test_install_gcsfuse_rejects_a_codename_that_is_not_one(colab, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match="codename"):
        install_gcsfuse(distribution="jammy; rm -rf /", run=lambda cmd: pytest.fail(f"ran {cmd}"))


def test_default_runner_raises_mount_error_with_stderr_tail():
    with pytest.raises(MountError, match=r"exit code 3: bash -c") as info:
        colab_helpers._run_command(["bash", "-c", "echo noise >&2; echo the reason >&2; exit 3"])
    assert str(info.value).splitlines()[1:] == ["noise", "the reason"]
    colab_helpers._run_command(["true"])
