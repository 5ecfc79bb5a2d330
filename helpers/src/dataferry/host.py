"""What a process can learn about the host it runs on: whether another process is alive, whether
this is a Colab runtime, what is mounted where. The floor below every other module: it imports none
of them."""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["pid_alive", "in_colab", "COLAB_ENV_VARS", "mount_table", "mount_of", "filesystem_of", "on_fuse",
           "on_network_filesystem"]

COLAB_ENV_VARS = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION")


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True when process ``pid`` runs (a zombie does not) and, if ``exe`` is given, runs that program."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    if stat[stat.rindex(")") + 2] in "ZX":
        return False
    if exe is not None:
        try:
            return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(exe)
        except OSError:
            return False
    return True


def in_colab() -> bool:
    """True in a Colab runtime: google.colab imported, or importable with one of Colab's variables set."""
    if "google.colab" in sys.modules:
        return True
    if not any(os.environ.get(name) for name in COLAB_ENV_VARS):
        return False
    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False


#: Filesystem types whose every read can wait on a network: FUSE (Drive, gcsfuse, sshfs) and network mounts.
NETWORK_FILESYSTEMS = ("fuse", "nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "glusterfs", "lustre", "afs")


def mount_table() -> list[tuple[str, str]]:
    """(mount point, filesystem type) for every mount in this mount namespace, in /proc/self/mounts' order
    (empty where there is no /proc). Points keep any byte the kernel escaped (``\\040`` for a space)."""
    import re

    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            rows.append((point, parts[2]))
    return rows


def mount_of(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(mount point, filesystem type) of the innermost mount holding ``path`` (the last mounted, when two share
    a mount point): ``("/", "ext4")``, ``("/content/drive", "fuse.drive")`` ...; ``("", "")`` if none is known."""
    target = os.path.realpath(path)
    best = ("", "")
    for point, fstype in mount_table():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def filesystem_of(path: str | os.PathLike[str]) -> str:
    """The filesystem type ``path`` is on (``ext4``, ``overlay``, ``fuse``, ``fuse.gcsfuse`` ...): that of the
    innermost mount holding it (:func:`mount_of`); ``""`` if none is known."""
    return mount_of(path)[1]


def on_fuse(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is on a FUSE mount (``fuse``, ``fuse.drive``, ``fuse.gcsfuse``; not ``fuseblk``, a disk's):
    its daemon numbers the files itself, and gcsfuse numbers a file anew each time the kernel looks it up afresh."""
    return filesystem_of(path).split(".")[0] == "fuse"


def on_network_filesystem(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is on a FUSE or network mount (:data:`NETWORK_FILESYSTEMS`; a Drive or gcsfuse mount
    in Colab), where a read can wait on the network, or on a mount this process cannot see; False on a local
    disk, tmpfs or overlay."""
    kind = filesystem_of(path)
    return not kind or kind.split(".")[0] in NETWORK_FILESYSTEMS
