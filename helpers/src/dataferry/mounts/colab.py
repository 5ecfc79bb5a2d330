"""The Colab helpers: sign in, mount Google Drive, install gcsfuse, download a file to the browser.

They import ``google.colab`` only when called, and raise :class:`NotInColab` elsewhere so that
lessons can fall back to the lab.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dataferry.errors import DataferryError
from dataferry.host import in_colab
from dataferry.mounts.fuse import LOG_TAIL_LINES, MountError, is_mounted

__all__ = ["NotInColab", "authenticate", "mount_drive", "download", "install_gcsfuse", "GCSFUSE_APT_REPO"]

GCSFUSE_APT_REPO = "https://packages.cloud.google.com/apt"
GCSFUSE_KEYRING = "/usr/share/keyrings/cloud.google.gpg"
GCSFUSE_SOURCES_LIST = "/etc/apt/sources.list.d/gcsfuse.list"
GCSFUSE_INSTALL_GUIDE = "https://cloud.google.com/storage/docs/cloud-storage-fuse/install"
# Seconds between Drive warm-up listings: attempt n waits n * _BACKOFF_S before the next one.
_BACKOFF_S = 1.0
_CODENAME = re.compile(r"[a-z0-9][a-z0-9.-]*")


class NotInColab(DataferryError, RuntimeError):
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
