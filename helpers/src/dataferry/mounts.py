"""Mounting cloud storage as a folder: gcsfuse mounts, with clear errors and clean unmounts.

A FUSE mount can fail in ways that hang a notebook forever (a daemon that never answers, a
"Transport endpoint is not connected" after a crash). Every function here has a timeout and
raises :class:`MountError` with what went wrong and the tail of the daemon's log.

The Colab helpers (:func:`in_colab`, :func:`authenticate`, :func:`mount_drive`,
:func:`install_gcsfuse`) import ``google.colab`` only when called, and raise :class:`NotInColab`
elsewhere so that lessons can fall back to the lab.

This module imports only :mod:`dataferry.host`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dataferry.host import in_colab

__all__ = [
    "MountError",
    "GcsfuseMount",
    "mount_gcsfuse",
    "file_cache_room_mb",
    "unmount",
    "is_mounted",
    "fuse_status",
    "NotInColab",
    "in_colab",
    "authenticate",
    "mount_drive",
    "GCSFUSE_APT_REPO",
    "install_gcsfuse",
    "download",
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


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` of a daemon's log (gcsfuse's JSON lines shown as 'SEVERITY message')."""
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
        return log_tail(self.log_path, lines)

    def __enter__(self) -> GcsfuseMount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "unmounted"
        cache = f", file cache at {self.cache_dir}" if self.cache_dir else ", no file cache"
        return f"<GcsfuseMount gs://{self.bucket} at {self.mountpoint} ({state}{cache}, pid {self.pid})>"


def _kept_free(usage: Any) -> int:
    """Bytes a default file cache leaves free on its disk for everything else: a tenth of the disk,
    but never more than half of what is free (a big disk that is mostly used still has room), and
    at least 1 GiB."""
    return max(1 << 30, min(usage.total // 10, usage.free // 2))


def file_cache_room_mb(usage: Any) -> int:
    """The MB a default gcsfuse file cache may take on a disk whose ``shutil.disk_usage`` is ``usage``."""
    return max(0, usage.free - _kept_free(usage)) // 2**20


def _file_cache_mb(cache: Path, asked: int | None) -> int:
    """gcsfuse's ``file-cache: max-size-mb`` for a cache in ``cache``: what was asked, checked
    against the disk's free space, or by default :func:`file_cache_room_mb`."""
    usage = shutil.disk_usage(cache)
    reserve = _kept_free(usage)
    room_mb = file_cache_room_mb(usage)
    if asked == -1:
        warnings.warn(f"an unlimited gcsfuse file cache can fill the disk under {cache} "
                      f"({usage.free / 1e9:.1f} GB free): pass cache_max_mb to bound it", UserWarning, stacklevel=3)
        return -1
    if asked is not None and asked * 2**20 > usage.free:
        raise MountError(f"a {asked} MB file cache does not fit: the disk under {cache} has {usage.free // 2**20} MB "
                         "free. Pass a smaller cache_max_mb, or free some space.")
    if asked is None and room_mb < 64:
        raise MountError(f"no room for a file cache under {cache}: {usage.free // 2**20} MB free, and "
                         f"{reserve // 2**20} MB are kept free for everything else. Free some space, put the "
                         "cache on another disk, or mount without cache_dir.")
    return asked if asked is not None else int(room_mb)


def _config_text(config: Mapping[str, Any]) -> str:
    """gcsfuse's config file as JSON, which is YAML: every path and value is quoted as it must be."""
    return json.dumps(config, indent=1)


def mount_gcsfuse(
    bucket: str,
    mountpoint: str | os.PathLike[str] | None = None,
    *,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_max_mb: int | None = None,
    anonymous: bool = False,
    gcsfuse: str = "gcsfuse",
    config: Mapping[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
) -> GcsfuseMount:
    """Mount ``bucket`` with gcsfuse and wait until the mount answers.

    ``endpoint`` is a GCS JSON API base such as ``http://127.0.0.1:4443`` (the lab); None means
    ``$STORAGE_EMULATOR_HOST`` when set (the variable google-cloud-storage honours), else Google. A
    custom endpoint turns off gcsfuse's hierarchical-namespace probe, which emulators do not serve.
    ``cache_dir`` turns on gcsfuse's file cache there: a file read once is re-read from local disk
    until unmount. Its size is ``cache_max_mb``; None bounds it to the free space of that disk less
    a reserve (a tenth of the disk, at most half the free space, at least 1 GiB: see
    :func:`file_cache_room_mb`), because gcsfuse's own "unlimited" (-1)
    can fill a Colab runtime's disk; -1 is still yours to ask for, with a warning. ``config`` is
    merged into the gcsfuse config file.
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
    endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or None
    settings: dict[str, Any] = {"logging": {"severity": "info"}}
    if endpoint:
        # gcsfuse first asks for the bucket's storage layout over gRPC, which emulators such as
        # fake-gcs-server do not serve: it retries until timeout unless hierarchical namespaces are off.
        settings["enable-hns"] = False
    cache = Path(cache_dir).absolute() if cache_dir is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        try:
            limit = _file_cache_mb(cache, cache_max_mb)
        except MountError:
            for folder in owned:  # the work folder, and the mount point if this call made it
                shutil.rmtree(folder, ignore_errors=True)
            raise
        settings["cache-dir"] = str(cache)
        settings["file-cache"] = {"max-size-mb": limit, "cache-file-for-range-read": True}
    for key, value in (config or {}).items():
        if isinstance(value, Mapping) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    config_path = work / "gcsfuse.yaml"
    config_path.write_text(_config_text(settings) + "\n")
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
    tail = log_tail(log)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    try:
        mount.unmount(timeout=5)
    except MountError:
        pass
    raise MountError(f"{problem} Last lines of the gcsfuse log:\n{tail}")


# -- Colab ------------------------------------------------------------------------------------

GCSFUSE_APT_REPO = "https://packages.cloud.google.com/apt"
GCSFUSE_KEYRING = "/usr/share/keyrings/cloud.google.gpg"
GCSFUSE_SOURCES_LIST = "/etc/apt/sources.list.d/gcsfuse.list"
GCSFUSE_INSTALL_GUIDE = "https://cloud.google.com/storage/docs/cloud-storage-fuse/install"
# Seconds between Drive warm-up listings: attempt n waits n * _BACKOFF_S before the next one.
_BACKOFF_S = 1.0
_CODENAME = re.compile(r"[a-z0-9][a-z0-9.-]*")


class NotInColab(RuntimeError):
    """Raised by Colab-only helpers outside Colab; lessons catch it and fall back to the lab."""


def authenticate() -> None:
    """Sign the Colab user in, so that google-cloud-storage and gcsfuse find credentials."""
    if not in_colab():
        raise NotInColab(
            "authenticate() only works in Colab; elsewhere use `gcloud auth application-default login` "
            "or a service-account key (GOOGLE_APPLICATION_CREDENTIALS)"
        )
    from google.colab import auth

    auth.authenticate_user()


def _list_dir(path: str, timeout: float, lister: Callable[[str], object]) -> None:
    """Run ``lister(path)`` in a helper thread: a hung FUSE daemon raises TimeoutError, not a hang."""
    outcome: dict[str, BaseException | None] = {}

    def probe() -> None:
        try:
            lister(path)
            outcome["error"] = None
        except OSError as e:
            outcome["error"] = e

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    if "error" not in outcome:
        raise TimeoutError(errno.ETIMEDOUT, f"listing did not answer within {timeout:g} s", path)
    if outcome["error"] is not None:
        raise outcome["error"]


def _scan_all(path: str) -> None:
    """List every entry of ``path`` (what a first ``ls`` of a Drive folder does)."""
    with os.scandir(path) as entries:
        for _ in entries:
            pass


def mount_drive(
    mountpoint: str = "/content/drive",
    *,
    readonly: bool = True,
    timeout_s: float = 120.0,
    warm_up: str | None = "MyDrive",
    retries: int = 3,
) -> Path:
    """Mount Google Drive in Colab and list ``warm_up`` until it answers; returns that folder.

    A healthy existing mount is kept; a broken one ("Transport endpoint is not connected") is
    remounted. Drive's first listing often fails or stalls, so it is retried ``retries`` times
    with a growing pause, remounting once on ENOTCONN. Raises :class:`MountError` if it never
    answers, and :class:`NotInColab` outside Colab.
    """
    if not in_colab():
        raise NotInColab(
            "mount_drive() only works in Colab (google.colab.drive); elsewhere read a local folder "
            "instead (LocalSource(path)); in the course, use the lab's Drive stand-in, a local FUSE mount"
        )
    from google.colab import drive

    point = os.fspath(mountpoint)
    timeout_ms = int(timeout_s * 1000)

    def mount(force: bool) -> None:
        try:
            drive.mount(point, force_remount=force, timeout_ms=timeout_ms, readonly=readonly)
        except Exception as e:
            raise MountError(
                f"drive.mount({point!r}) failed: {e}. Try Runtime > Disconnect and delete runtime, "
                "then run this cell again."
            ) from e

    if is_mounted(point):
        try:
            _list_dir(point, timeout_s, os.listdir)
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                mount(force=True)
    else:
        mount(force=False)

    target = os.path.join(point, warm_up) if warm_up else point
    attempts = max(1, retries)
    remounted = False
    last: OSError | None = None
    for attempt in range(1, attempts + 1):
        try:
            _list_dir(target, timeout_s, _scan_all)
            return Path(target)
        except OSError as e:
            last = e
            if e.errno == errno.ENOTCONN and not remounted:
                remounted = True
                mount(force=True)
        if attempt < attempts:
            time.sleep(_BACKOFF_S * attempt)
    raise MountError(
        f"Google Drive at {point} did not answer: listing {target} failed {attempts} time(s), last with {last}. "
        "Run `from google.colab import drive; drive.flush_and_unmount()` and mount again, or use "
        "Runtime > Disconnect and delete runtime and start over."
    )


def download(path: str | os.PathLike[str]) -> None:
    """Offer a file for download to the browser running this Colab notebook."""
    if not in_colab():
        raise NotInColab(f"download() only works in Colab; the file is at {path}")
    from google.colab import files

    files.download(os.fspath(path))


def _run_command(cmd: list[str]) -> None:
    """Run ``cmd``; raise :class:`MountError` with the tail of its stderr when it fails."""
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise MountError(f"{cmd[0]} not found: {e}") from e
    except subprocess.CalledProcessError as e:
        tail = "\n".join((e.stderr or e.stdout or "").strip().splitlines()[-LOG_TAIL_LINES:]) or "(no output)"
        raise MountError(f"command failed with exit code {e.returncode}: {shlex.join(cmd)}\n{tail}") from e


def _os_codename() -> str:
    """This system's release codename (``lsb_release -c -s``), e.g. ``jammy``."""
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        fields = {}
    for key in ("VERSION_CODENAME", "UBUNTU_CODENAME"):
        value = fields.get(key, "").strip().strip('"')
        if value:
            return value
    if shutil.which("lsb_release"):
        proc = subprocess.run(["lsb_release", "-c", "-s"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    raise MountError("cannot tell this system's release codename: pass distribution='jammy' (or yours)")


def _gcsfuse_version(exe: str) -> str:
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise MountError(f"{exe} --version failed (exit code {proc.returncode}): {proc.stderr.strip()}")
    return lines[0]


def install_gcsfuse(
    *,
    distribution: str | None = None,
    run: Callable[[list[str]], None] | None = None,
) -> str:
    """Install gcsfuse in Colab from Google's apt repository; returns ``gcsfuse --version``'s first line.

    The repository key goes into a keyring named by ``signed-by`` (apt-key is deprecated).
    ``distribution`` is the release codename (default: this system's). ``run`` runs each command,
    given as a list of arguments (default: subprocess, raising :class:`MountError` on failure).
    Does nothing but report the version when gcsfuse is already on PATH.
    """
    if not in_colab():
        raise NotInColab(
            "install_gcsfuse() only installs in Colab; on your own machine follow Google's install guide "
            f"({GCSFUSE_INSTALL_GUIDE}), or run `dataferry lab build` for the lab's gcsfuse"
        )
    existing = shutil.which("gcsfuse")
    if existing:
        return _gcsfuse_version(existing)
    codename = distribution or _os_codename()
    if not _CODENAME.fullmatch(codename):
        raise ValueError(f"not a release codename: {codename!r} (expected e.g. 'jammy')")
    runner = run or _run_command
    key_url = f"{GCSFUSE_APT_REPO}/doc/apt-key.gpg"
    source = f"deb [signed-by={GCSFUSE_KEYRING}] {GCSFUSE_APT_REPO} gcsfuse-{codename} main"
    runner(["bash", "-c", f"set -o pipefail; curl -fsSL {shlex.quote(key_url)} "
                          f"| gpg --batch --yes --dearmor -o {shlex.quote(GCSFUSE_KEYRING)}"])
    runner(["bash", "-c", f"echo {shlex.quote(source)} > {shlex.quote(GCSFUSE_SOURCES_LIST)}"])
    runner(["apt-get", "update", "-q"])
    runner(["apt-get", "install", "-y", "-q", "gcsfuse"])
    installed = shutil.which("gcsfuse")
    if installed is None:
        raise MountError("apt-get installed gcsfuse but it is not on PATH: check `dpkg -L gcsfuse`")
    return _gcsfuse_version(installed)
