"""up / down / crash recovery of a lab of its own (not the session lab), and the CLI by hand."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataferry.course.lab import Lab, LabError, lab_processes
from dataferry.mounts import fuse_status, is_mounted


def _fuse_mounts():
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2].startswith("fuse")]


def _assert_nothing_left(state: dict):
    run_dir = state["run_dir"]
    assert not any(p.startswith(run_dir) for p in _fuse_mounts()), "a lab mount is still in /proc/mounts"
    assert lab_processes(state["id"]) == [], "a lab process is still alive"
    for p in state["processes"].values():
        assert not Path(f"/proc/{p['pid']}").exists() or Path(f"/proc/{p['pid']}/stat").read_text().split()[2] == "Z"
    assert not Path(run_dir).exists(), "the run folder is still there"


@pytest.fixture
def own_lab(tmp_path):
    lab = Lab(state_dir=tmp_path / "state")
    yield lab
    lab.down()


def test_down_leaves_no_process_mount_or_folder(own_lab):
    lab = own_lab.up()
    state = lab.state
    lab.create_bucket("bkt").blob("f").upload_from_string(b"data")
    if state["gcsfuse"]["available"]:
        lab.mount("bkt")
        lab.mount("bkt", file_cache=True)
        assert len(lab.status()["mounts"]) == 2
    assert lab_processes(state["id"])
    done = lab.down()
    assert any("removed" in d for d in done)
    _assert_nothing_left(state)
    assert lab.status() == {"up": False, "state_dir": str(lab.state_dir)}
    assert lab.down() == []  # down twice is fine


def test_a_private_lab_is_gone_with_its_folders_when_its_block_ends_even_by_an_error():
    with pytest.raises(KeyError), Lab.private(gcsfuse=False) as lab:
        state = lab.state
        assert lab.create_bucket("private-one").exists()
        raise KeyError("the block fails")
    _assert_nothing_left(state)
    assert not lab.state_dir.exists(), "the state folder went too"


def test_up_twice_reuses_the_running_lab(own_lab):
    first = own_lab.up().state
    again = Lab(state_dir=own_lab.state_dir).up().state
    assert again["id"] == first["id"] and again["endpoint"] == first["endpoint"]


def test_up_after_a_crash_cleans_up_dead_pids_and_stale_mounts(own_lab):
    lab = own_lab.up()
    state = lab.state
    lab.create_bucket("bkt")
    stale = None
    if state["gcsfuse"]["available"]:
        m = lab.mount("bkt")
        stale = str(m.mountpoint)
        os.kill(m.pid, signal.SIGKILL)  # the daemon dies; the mount stays ("Transport endpoint ...")
        m.process.wait()
        assert is_mounted(stale)
    os.killpg(state["processes"]["toxiproxy-server"]["pid"], signal.SIGKILL)
    time.sleep(0.2)
    assert not lab.healthy()
    fresh = Lab(state_dir=own_lab.state_dir).up()
    assert fresh.healthy()
    assert fresh.state["id"] != state["id"]
    if stale:
        assert not is_mounted(stale)
    _assert_nothing_left(state)


def test_up_on_a_taken_port_says_who_has_it(own_lab):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LabError, match=rf"port {port} on 127.0.0.1 is taken by pid {os.getpid()} "):
            own_lab.up(port=port)
    assert not own_lab.state, "a failed up leaves no state behind"


def test_fixed_port_is_the_endpoint(own_lab):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert own_lab.up(port=port).endpoint == f"http://127.0.0.1:{port}"


def _cli(*args, state_dir, env=None, check=True):
    cmd = [sys.executable, "-m", "dataferry.course.cli", "lab", "--state-dir", str(state_dir), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_cli_up_mount_read_down_by_hand(tmp_path):
    """What the README tells a newcomer to do, in separate processes."""
    state_dir = tmp_path / "state"
    out = _cli("up", "--profile", "same-continent", state_dir=state_dir).stdout
    assert "export STORAGE_EMULATOR_HOST=http://127.0.0.1:" in out
    try:
        status = json.loads(_cli("status", "--json", state_dir=state_dir).stdout)
        assert status["up"] and status["profile"]["name"] == "same-continent"
        _cli("dataset", "hand", "--files", "3", "--size", "1000", "--shard-mb", "0", state_dir=state_dir)
        _cli("profile", "cross-continent", state_dir=state_dir)
        assert json.loads(_cli("status", "--json", state_dir=state_dir).stdout)["profile"]["name"] == "cross-continent"
        if status["gcsfuse"]["available"]:
            point = Path(_cli("mount", "hand", state_dir=state_dir).stdout.strip())
            assert is_mounted(point)
            assert len((point / "data/files/00/00/sample-000000.bin").read_bytes()) == 1000
        down = _cli("down", state_dir=state_dir).stdout
        assert "stopped fake-gcs-server" in down and "stopped toxiproxy-server" in down
        _assert_nothing_left(status)
        assert _cli("status", state_dir=state_dir, check=False).returncode == 3
    finally:
        _cli("down", state_dir=state_dir, check=False)


def test_fuse_status_explains_a_missing_device(tmp_path):
    ok, why = fuse_status(tmp_path / "fuse")
    assert not ok and "does not exist" in why
    assert fuse_status()[0] == Path("/dev/fuse").exists()


def test_lab_without_gcsfuse_still_serves_the_api(own_lab):
    lab = own_lab.up(gcsfuse=False)
    assert lab.status()["gcsfuse"] == {"available": False, "why": "not requested (gcsfuse=False)"}
    lab.create_bucket("bkt").blob("f").upload_from_string(b"data")
    assert lab.client().bucket("bkt").blob("f").download_as_bytes() == b"data"
    with pytest.raises(LabError, match="gcsfuse is unavailable in this lab: not requested"):
        lab.mount("bkt")
