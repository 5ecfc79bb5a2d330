"""FUSE plumbing shared by every mount: is FUSE usable, what is mounted, a daemon's log, unmounting.

A FUSE mount can fail in ways that hang a notebook forever (a daemon that never answers, a
"Transport endpoint is not connected" after a crash): everything here has a timeout, and fails
with :class:`MountError` saying what went wrong.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from dataferry.errors import DataferryError
from dataferry.host import mount_table

__all__ = ["MountError", "fuse_status", "is_mounted", "fuse_mounts_under", "log_tail", "unmount", "LOG_TAIL_LINES"]

LOG_TAIL_LINES = 15


class MountError(DataferryError, RuntimeError):
    """A mount or unmount failed; the message says why and what to do."""


def fuse_status(device: str | os.PathLike[str] = "/dev/fuse") -> tuple[bool, str]:
    """Whether FUSE mounts can work here, and if not, why (one line)."""
    dev = Path(device)
    if not dev.exists():
        return False, f"{dev} does not exist: this machine or container has no FUSE support"
    if not os.access(dev, os.R_OK | os.W_OK):
        return False, f"{dev} is not readable and writable by this user: run as root or get access to it"
    return True, f"{dev} is present and usable"


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a mount point (per /proc/self/mounts)."""
    target = os.path.realpath(path)
    return any(point == target for point, _ in mount_table())


def fuse_mounts_under(folder: str | os.PathLike[str]) -> list[str]:
    """FUSE mount points at or below ``folder``."""
    root = os.path.realpath(folder)
    return [
        point
        for point, fstype in mount_table()
        if fstype.startswith("fuse") and (point == root or point.startswith(root + os.sep))
    ]


def _log_line(line: str) -> str:
    """gcsfuse logs JSON objects; keep their severity and message."""
    try:
        entry = json.loads(line)
        return f"{entry.get('severity', '')} {entry.get('message', '').strip()}".strip()
    except (ValueError, AttributeError):
        return line


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` of a daemon's log (gcsfuse's JSON lines shown as 'SEVERITY message')."""
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(_log_line(line) for line in text[-lines:]) or "(log is empty)"


def answers(path: str, timeout: float) -> bool:
    """List ``path`` in a helper thread so that a hung FUSE daemon cannot hang the caller."""
    result: dict[str, bool] = {}

    def probe() -> None:
        try:
            os.listdir(path)
            result["ok"] = True
        except OSError:
            result["ok"] = False

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return result.get("ok", False)


def unmount(mountpoint: str | os.PathLike[str], timeout: float = 20.0) -> None:
    """Unmount a FUSE mount; falls back to a lazy unmount when the daemon is gone or stuck."""
    point = os.path.realpath(mountpoint)
    if not is_mounted(point):
        return
    commands = []
    if os.geteuid() == 0 and shutil.which("umount"):
        commands.append(["umount", point])
    for helper in ("fusermount3", "fusermount"):
        if shutil.which(helper):
            commands.append([helper, "-u", point])
    errors = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and is_mounted(point):
        for cmd in commands:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if proc.returncode == 0 or not is_mounted(point):
                return
            errors.append(proc.stderr.strip() or proc.stdout.strip())
        time.sleep(0.2)
    if is_mounted(point) and os.geteuid() == 0:
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=timeout)
    if is_mounted(point):
        last = errors[-1] if errors else "no umount or fusermount command available"
        raise MountError(f"could not unmount {point}: {last}. Close files open under it and retry.")
