"""The timing harness: cache-state control for honest cold and warm measurements.

A "cold" read means the kernel's page cache holds none of the file. :func:`evict` drops a
set of files from the page cache (``posix_fadvise(DONTNEED)`` per file; no root needed) and
:func:`resident_fraction` checks with ``mincore`` that it worked, so a measurement can say
``cold_verified`` instead of hoping. See MEASUREMENT.md for the rules this module follows.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["evict", "resident_fraction", "EvictionReport"]

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


def evict(paths: Iterable[str | os.PathLike[str]], verify: bool = True) -> EvictionReport:
    """Drop ``paths`` from the page cache with ``posix_fadvise(DONTNEED)`` and check with mincore."""
    paths = list(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # dirty pages cannot be dropped; read-only mounts refuse
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    resident = sum(1 for p in paths if resident_fraction(p) > 0) if verify else len(paths)
    return EvictionReport(len(paths), "posix_fadvise(DONTNEED) per file", resident)
