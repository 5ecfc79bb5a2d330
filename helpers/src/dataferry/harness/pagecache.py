"""The page cache, under control: drop files from it and check with ``mincore`` that they left.

A "cold" read means the kernel's page cache holds none of the file. :func:`evict` drops a set of files from the
page cache (``posix_fadvise(DONTNEED)`` per file, no root needed, or ``drop_caches`` when writable) and checks
with ``mincore`` that it worked, so a row can say ``cold_verified`` instead of hoping
(:func:`residency_state`). See MEASUREMENT.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["evict", "resident_fraction", "residency_state", "EvictionReport", "drop_caches", "CACHE_STATES", "PAGE"]

#: What a row says of the page cache (and the other caches) before a read.
CACHE_STATES = ("cold_verified", "cold_unverified", "page_warm", "daemon_warm", "local_copy")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def resident_fraction(path: str | os.PathLike[str]) -> float:
    """Share of the file's pages in the page cache (``mincore``); 0.0 for an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0.0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == _MAP_FAILED or addr is None:
            raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            return sum(v & 1 for v in vec) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


@dataclass
class EvictionReport:
    """What :func:`evict` did: files, how, and how many still had pages resident afterwards."""

    files: int
    method: str
    still_resident: int

    @property
    def verified(self) -> bool:
        return self.still_resident == 0

    @property
    def cache_state(self) -> str:
        return "cold_verified" if self.verified else "cold_unverified"


def drop_caches(level: int = 1) -> bool:
    """``sync; echo LEVEL > /proc/sys/vm/drop_caches`` (1: page cache, 2: dentries and inodes,
    3: both). Returns False, doing nothing, where that file is not writable (not root, a container)."""
    if level not in (1, 2, 3) or not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(str(level))
    except OSError:
        return False
    return True


def evict(paths: Iterable[str | os.PathLike[str]], verify: bool = True, global_level: int | None = None) -> EvictionReport:
    """Drop ``paths`` from the page cache and check with mincore which still have pages resident.

    Per file with ``posix_fadvise(DONTNEED)``; with ``global_level`` also through drop_caches
    when it is writable (e.g. 3 for a fully cold start: metadata too). Works on local files and
    FUSE mounts; it does not reach gcsfuse's own file cache (remount with an empty cache dir)."""
    paths = list(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # dirty pages cannot be dropped; read-only mounts refuse
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    method = "posix_fadvise(DONTNEED) per file"
    if global_level is not None and drop_caches(global_level):
        method += f" + drop_caches={global_level}"
    resident = sum(1 for p in paths if resident_fraction(p) > 0) if verify else len(paths)
    return EvictionReport(len(paths), method, resident)


def residency_state(paths: Iterable[str | os.PathLike[str]]) -> str:
    """The page-cache state of files about to be read: ``cold_verified`` (no page resident),
    ``page_warm`` (every file fully resident) or ``cold_unverified`` (anything in between)."""
    fractions = [resident_fraction(p) for p in paths]
    if all(f == 0 for f in fractions):
        return "cold_verified"
    return "page_warm" if all(f == 1 for f in fractions) else "cold_unverified"
