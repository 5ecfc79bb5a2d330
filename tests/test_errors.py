"""Missing tools and failed builds give one clear line, from the API and from the CLI."""

import os
import subprocess
import sys

import pytest

from dataferry.course.lab import TOOLS, ToolError, ensure_tool
from dataferry.course.lab.tools import Tool, find_tool, go_version
from dataferry.mounts import MountError, mount_gcsfuse


def _env_without_go(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("umount", "sh"):
        src = f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else f"/bin/{tool}"
        os.symlink(src, bare / tool)
    return {**os.environ, "PATH": str(bare), "DATAFERRY_TOOLS": str(tmp_path / "tools")}


def test_missing_go_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _env_without_go(tmp_path)["PATH"])
    assert go_version() is None
    with pytest.raises(ToolError, match=r"cannot build toxiproxy-server: Go is not installed or not on PATH.*Go >= 1\.2"):
        ensure_tool("toxiproxy-server", tmp_path / "tools")


def test_cli_without_go_exits_2_with_one_line(tmp_path):
    env = _env_without_go(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "dataferry.course.cli", "lab", "--state-dir", str(tmp_path / "s"), "up"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dataferry: error:")]
    assert len(lines) == 1 and "Go is not installed" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "s" / "state.json").exists()


def test_failed_build_names_tool_version_and_log(tmp_path, monkeypatch):
    """A pin that does not exist fails in the real go command; the error says which and where the log is."""
    if go_version() is None:
        pytest.skip("needs Go")
    bogus = Tool("toxiproxy-server", TOOLS["toxiproxy-server"].package, ("v2.999.0",), "server")
    monkeypatch.setitem(TOOLS, "toxiproxy-server", bogus)
    with pytest.raises(ToolError, match=r"building toxiproxy-server with go1\.\d+(\.\d+)? failed \(v2\.999\.0: .+\); full output in .*build\.log"):
        ensure_tool("toxiproxy-server", tmp_path)
    assert "v2.999.0" in (tmp_path / "build.log").read_text()
    assert find_tool("toxiproxy-server", tmp_path) is None


def test_unknown_tool(tmp_path):
    with pytest.raises(ToolError, match="unknown lab tool 'minio'"):
        ensure_tool("minio", tmp_path)


def test_missing_gcsfuse_binary(tmp_path):
    with pytest.raises(MountError, match="gcsfuse not found"):
        mount_gcsfuse("bucket", tmp_path / "m", gcsfuse=str(tmp_path / "no-gcsfuse"))
    assert not (tmp_path / "m").exists()


def test_reading_a_bucket_without_credentials_says_how_to_sign_in(no_credentials, tmp_path):
    """google-auth's DefaultCredentialsError becomes one line that says what to do, in Colab and
    elsewhere, and that a public bucket needs no credentials."""
    from dataferry.sources import GCSSource, NoCredentials, SourceError

    with pytest.raises(NoCredentials) as caught:
        list(GCSSource("some-bucket", "train").list())
    assert isinstance(caught.value, SourceError) and isinstance(caught.value, PermissionError)
    for advice in ("gs://some-bucket/train/", "dataferry.mounts.authenticate()",
                   "gcloud auth application-default login", "GOOGLE_APPLICATION_CREDENTIALS",
                   "create_anonymous_client()"):
        assert advice in str(caught.value)
    proc = subprocess.run([sys.executable, "-m", "dataferry.course.cli", "stage", "gs://some-bucket/train/", "--cache",
                           str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dataferry: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "dataferry: error: no Google credentials found to read gs://some-bucket/train/"), \
        f"one error line of its own, not glued to the staging bar: {proc.stderr!r}"
