"""Mounting cloud storage as a folder: gcsfuse mounts and Google Drive, with clear errors and clean unmounts.

A FUSE mount can fail in ways that hang a notebook forever (a daemon that never answers, a
"Transport endpoint is not connected" after a crash). Every function here has a timeout and
raises :class:`MountError` with what went wrong and the tail of the daemon's log.

- :mod:`~dataferry.mounts.gcsfuse`: :func:`mount_gcsfuse` and the :class:`GcsfuseMount` it returns;
- :mod:`~dataferry.mounts.colab`: :func:`authenticate`, :func:`mount_drive`, :func:`install_gcsfuse`,
  :func:`download`, which import ``google.colab`` only when called and raise :class:`NotInColab`
  elsewhere;
- :mod:`~dataferry.mounts.fuse`: what every mount shares (is FUSE usable, what is mounted, unmount).

This package imports only :mod:`dataferry.host`.
"""

from dataferry.host import in_colab
from dataferry.mounts.colab import GCSFUSE_APT_REPO, NotInColab, authenticate, download, install_gcsfuse, mount_drive
from dataferry.mounts.fuse import LOG_TAIL_LINES, MountError, fuse_mounts_under, fuse_status, is_mounted, log_tail, unmount
from dataferry.mounts.gcsfuse import GcsfuseMount, file_cache_room_mb, mount_gcsfuse

__all__ = [
    "MountError",
    "GcsfuseMount",
    "mount_gcsfuse",
    "file_cache_room_mb",
    "unmount",
    "is_mounted",
    "fuse_status",
    "fuse_mounts_under",
    "log_tail",
    "LOG_TAIL_LINES",
    "NotInColab",
    "in_colab",
    "authenticate",
    "mount_drive",
    "GCSFUSE_APT_REPO",
    "install_gcsfuse",
    "download",
]
