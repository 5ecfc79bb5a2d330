"""gcsfuse mounts of a bucket that wait until they answer, size their file cache to the disk, and
fail with gcsfuse's own log."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dataferry.mounts.fuse import LOG_TAIL_LINES, MountError, answers, fuse_status, is_mounted, log_tail, unmount

__all__ = ["GcsfuseMount", "mount_gcsfuse", "file_cache_room_mb"]

_MISSING_BUCKET = re.compile(r"bucket doesn't exist|bucket does not exist")


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
    if asked == -1:
        warnings.warn(f"an unlimited gcsfuse file cache can fill the disk under {cache} "
                      f"({usage.free / 1e9:.1f} GB free): pass cache_max_mb to bound it", UserWarning, stacklevel=3)
        return -1
    if asked is not None and asked * 2**20 > usage.free:
        raise MountError(f"a {asked} MB file cache does not fit: the disk under {cache} has {usage.free // 2**20} MB "
                         "free. Pass a smaller cache_max_mb, or free some space.")
    if asked is not None:
        return asked
    if file_cache_room_mb(usage) < 64:
        raise MountError(f"no room for a file cache under {cache}: {usage.free // 2**20} MB free, and "
                         f"{_kept_free(usage) // 2**20} MB are kept free for everything else. Free some space, put "
                         "the cache on another disk, or mount without cache_dir.")
    return file_cache_room_mb(usage)


def _config_text(config: Mapping[str, Any]) -> str:
    """gcsfuse's config file as JSON, which is YAML: every path and value is quoted as it must be."""
    return json.dumps(config, indent=1)


def mount_gcsfuse(
    bucket: str,
    mountpoint: str | os.PathLike[str] | None = None,
    *,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    file_cache: bool = False,
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
    until unmount. ``file_cache=True`` without ``cache_dir`` puts the cache in a temp folder of the
    mount's own, removed at unmount (a file cache left behind holds a copy of everything read). Its size is ``cache_max_mb``; None bounds it to the free space of that disk less
    a reserve (a tenth of the disk, at most half the free space, at least 1 GiB: see
    :func:`file_cache_room_mb`), because gcsfuse's own "unlimited" (-1) can fill a Colab runtime's
    disk; -1 is still yours to ask for, with a warning. ``config`` is merged into the gcsfuse
    config file.
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
    cache = Path(cache_dir).absolute() if cache_dir is not None else work / "file-cache" if file_cache else None
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
        if is_mounted(point) and answers(str(point), max(0.1, deadline - time.monotonic())):
            # Without its start-up bucket check (off for emulators), gcsfuse mounts a missing
            # bucket as an empty folder and only logs the 404 when the folder is listed.
            if _MISSING_BUCKET.search(log.read_text(errors="replace")):
                problem = f"gs://{bucket} does not exist{where} (gcsfuse mounted it as an empty folder)."
                break
            if not any(p.is_relative_to(work) for p in (point, log, cache) if p is not None):
                # gcsfuse has read its config: with the mount point, log and cache elsewhere, the work folder
                # holds nothing more, and it goes now, for a mount that another process unmounts (the CLI's).
                shutil.rmtree(work, ignore_errors=True)
                owned.remove(work)
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
