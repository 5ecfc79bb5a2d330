"""The lab's processes and ports: find what a lab started (by its environment marker), stop it
for sure, and say who holds a port the lab wants."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from dataferry.host import pid_alive
from dataferry.course.lab.errors import LabError

__all__ = ["HOST", "LAB_ID_ENV", "alive", "stop", "lab_processes", "free_port", "check_port_free"]

HOST = "127.0.0.1"
LAB_ID_ENV = "DATAFERRY_LAB_ID"


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int, exe: str | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, runs ``exe``; reaps it if it is our child."""
    reap(pid)
    return pid_alive(pid, exe)


def stop(pid: int, exe: str | None, timeout: float = 5.0) -> bool:
    """SIGTERM then SIGKILL the process (and its group); True if it was running."""
    if not alive(pid, exe):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.05)
    if alive(pid):
        raise LabError(f"process {pid} ({exe}) survived SIGKILL; stop it by hand")
    return True


def lab_processes(lab_id: str) -> list[int]:
    """Pids of every live process started by the lab ``lab_id`` (found by its environment marker)."""
    marker = f"{LAB_ID_ENV}={lab_id}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker in (d / "environ").read_bytes().split(b"\0") and alive(int(d.name)):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_owner(port: int) -> str:
    """Who listens on TCP ``port``: 'pid N (cmdline)' when it can be found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # LISTEN
                    inodes.add(cols[9])
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fds = list((d / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:  # one fd closing meanwhile (the listing's own, for one) must not hide the others
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                with contextlib.suppress(OSError):
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {d.name} ({cmd[:120]})"
                return f"pid {d.name}"
    return "another program"


def check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            raise LabError(
                f"port {port} on {HOST} is taken by {port_owner(port)}: stop it or choose another port"
            ) from None
