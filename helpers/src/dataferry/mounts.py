"""Mounting cloud storage as a folder: gcsfuse mounts, with clear errors and clean unmounts.

A FUSE mount can fail in ways that hang a notebook forever (a daemon that never answers, a
"Transport endpoint is not connected" after a crash). Every function here has a timeout and
raises :class:`MountError` with what went wrong and the tail of the daemon's log.

This module imports no other dataferry module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "MountError",
    "GcsfuseMount",
    "mount_gcsfuse",
    "unmount",
    "is_mounted",
    "fuse_status",
]

LOG_TAIL_LINES = 15
_MISSING_BUCKET = re.compile(r"bucket doesn't exist|bucket does not exist")


class MountError(RuntimeError):
    """A mount or unmount failed; the message says why and what to do."""


def fuse_status(device: str | os.PathLike[str] = "/dev/fuse") -> tuple[bool, str]:
    """Whether FUSE mounts can work here, and if not, why (one line)."""
    dev = Path(device)
    if not dev.exists():
        return False, f"{dev} does not exist: this machine or container has no FUSE support"
    if not os.access(dev, os.R_OK | os.W_OK):
        return False, f"{dev} is not readable and writable by this user: run as root or get access to it"
    return True, f"{dev} is present and usable"


def _mount_table() -> list[tuple[str, str]]:
    """(mountpoint, fstype) for every mount in this mount namespace."""
    rows = []
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                # /proc/mounts escapes spaces and a few other characters as octal.
                point = parts[1].encode().decode("unicode_escape")
                rows.append((point, parts[2]))
    return rows


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a mount point (per /proc/self/mounts)."""
    target = os.path.realpath(path)
    return any(point == target for point, _ in _mount_table())


def fuse_mounts_under(folder: str | os.PathLike[str]) -> list[str]:
    """FUSE mount points at or below ``folder``."""
    root = os.path.realpath(folder)
    return [
        point
        for point, fstype in _mount_table()
        if fstype.startswith("fuse") and (point == root or point.startswith(root + os.sep))
    ]


def _log_line(line: str) -> str:
    """gcsfuse logs JSON objects; keep their severity and message."""
    try:
        entry = json.loads(line)
        return f"{entry.get('severity', '')} {entry.get('message', '').strip()}".strip()
    except (ValueError, AttributeError):
        return line


def _log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(_log_line(line) for line in text[-lines:]) or "(log is empty)"


def _answers(path: str, timeout: float) -> bool:
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


class GcsfuseMount:
    """A running gcsfuse mount of one bucket; unmount it with :meth:`unmount` or a ``with`` block."""

    def __init__(
        self,
        bucket: str,
        mountpoint: Path,
        process: subprocess.Popen[bytes],
        log_path: Path,
        cache_dir: Path | None,
        args: list[str],
        owned_dirs: list[Path],
    ) -> None:
        self.bucket = bucket
        self.mountpoint = mountpoint
        self.process = process
        self.log_path = log_path
        self.cache_dir = cache_dir
        self.args = args
        self._owned_dirs = owned_dirs
        self.on_unmount: Callable[[GcsfuseMount], None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def mounted(self) -> bool:
        return self.process.poll() is None and is_mounted(self.mountpoint)

    def unmount(self, timeout: float = 20.0) -> None:
        """Unmount, wait for gcsfuse to exit, and remove the folders this mount created."""
        try:
            unmount(self.mountpoint, timeout=timeout)
        finally:
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
            for d in self._owned_dirs:
                shutil.rmtree(d, ignore_errors=True)
            if self.on_unmount is not None:
                self.on_unmount(self)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _log_tail(self.log_path, lines)

    def __enter__(self) -> GcsfuseMount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "unmounted"
        cache = f", file cache at {self.cache_dir}" if self.cache_dir else ", no file cache"
        return f"<GcsfuseMount gs://{self.bucket} at {self.mountpoint} ({state}{cache}, pid {self.pid})>"


def _yaml(config: Mapping[str, Any], indent: int = 0) -> str:
    """The small YAML subset gcsfuse config files need (nested mappings of scalars)."""
    out = []
    for key, value in config.items():
        pad = "  " * indent
        if isinstance(value, Mapping):
            out.append(f"{pad}{key}:\n{_yaml(value, indent + 1)}")
        elif isinstance(value, bool):
            out.append(f"{pad}{key}: {'true' if value else 'false'}")
        else:
            out.append(f"{pad}{key}: {value}")
    return "\n".join(out)


def mount_gcsfuse(
    bucket: str,
    mountpoint: str | os.PathLike[str] | None = None,
    *,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    anonymous: bool = False,
    gcsfuse: str = "gcsfuse",
    config: Mapping[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
) -> GcsfuseMount:
    """Mount ``bucket`` with gcsfuse and wait until the mount answers.

    ``endpoint`` is a GCS JSON API base such as ``http://127.0.0.1:4443`` (the lab), or None for
    Google. ``cache_dir`` turns on gcsfuse's file cache there (unlimited size): a file read once is
    re-read from local disk until unmount. ``config`` is merged into the gcsfuse config file.
    Raises :class:`MountError` with the tail of gcsfuse's log when it exits or does not answer in
    ``timeout`` seconds. Use the result in a ``with`` block or call ``.unmount()``.
    """
    ok, why = fuse_status()
    if not ok:
        raise MountError(f"cannot mount gs://{bucket}: {why}")
    exe = shutil.which(gcsfuse)
    if exe is None:
        raise MountError(
            f"gcsfuse not found ({gcsfuse!r}): install it (in Colab: dataferry.mounts.install_gcsfuse()) "
            "or pass gcsfuse='/path/to/gcsfuse'"
        )
    owned: list[Path] = []
    work = Path(tempfile.mkdtemp(prefix=f"gcsfuse-{bucket}-"))
    owned.append(work)
    if mountpoint is None:
        point = work / "mnt"
        point.mkdir()
    else:
        point = Path(mountpoint).absolute()
        if is_mounted(point):
            shutil.rmtree(work, ignore_errors=True)
            raise MountError(f"{point} is already a mount point: unmount it first (dataferry.mounts.unmount)")
        if not point.exists():
            point.mkdir(parents=True)
            owned.append(point)
        elif any(point.iterdir()):
            shutil.rmtree(work, ignore_errors=True)
            raise MountError(f"{point} is not empty: mount onto an empty folder")
    log = Path(log_path) if log_path else work / "gcsfuse.log"
    settings: dict[str, Any] = {"logging": {"severity": "info"}}
    cache = Path(cache_dir).absolute() if cache_dir is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        settings["cache-dir"] = str(cache)
        settings["file-cache"] = {"max-size-mb": -1, "cache-file-for-range-read": True}
    for key, value in (config or {}).items():
        if isinstance(value, Mapping) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    config_path = work / "gcsfuse.yaml"
    config_path.write_text(_yaml(settings) + "\n")
    args = [exe, "--foreground", "--implicit-dirs", "--config-file", str(config_path)]
    if anonymous:
        args.append("--anonymous-access")
    if endpoint:
        args += ["--custom-endpoint", endpoint.rstrip("/") + "/storage/v1/"]
    args += [*extra_args, bucket, str(point)]
    child_env = {**os.environ, **(env or {})}
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True, env=child_env,
        )
    mount = GcsfuseMount(bucket, point, proc, log, cache, args, owned)
    where = f" at {endpoint}" if endpoint else ""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            problem = (
                f"gcsfuse exited with code {proc.returncode} while mounting gs://{bucket}{where}. "
                "Is the bucket name right, does the bucket exist, and may you read it?"
            )
            break
        if is_mounted(point) and _answers(str(point), max(0.1, deadline - time.monotonic())):
            # Without its start-up bucket check (off for emulators), gcsfuse mounts a missing
            # bucket as an empty folder and only logs the 404 when the folder is listed.
            if _MISSING_BUCKET.search(log.read_text(errors="replace")):
                problem = f"gs://{bucket} does not exist{where} (gcsfuse mounted it as an empty folder)."
                break
            return mount
        if time.monotonic() > deadline:
            problem = f"gcsfuse did not answer within {timeout:.0f} s while mounting gs://{bucket}{where}."
            break
        time.sleep(0.1)
    tail = _log_tail(log)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    try:
        mount.unmount(timeout=5)
    except MountError:
        pass
    raise MountError(f"{problem} Last lines of the gcsfuse log:\n{tail}")
