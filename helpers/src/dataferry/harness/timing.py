"""Timed reads: the same spans for every method (:func:`timed_read`), and host-to-device copies (:func:`time_h2d`).

Cache-state control is :mod:`dataferry.harness.pagecache`'s; the rows go to :mod:`dataferry.harness.results`.
See MEASUREMENT.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["timed_read", "Spans", "time_h2d", "CHUNK"]

CHUNK = 1 << 20


@dataclass
class Spans:
    """The same spans for every method: open, first byte, whole read, close (``perf_counter_ns``).
    ``read_ns`` runs from the end of open to the last byte, so it includes ``first_byte_ns``."""

    bytes: int
    open_ns: int
    first_byte_ns: int
    read_ns: int
    close_ns: int

    @property
    def ns(self) -> int:
        return self.open_ns + self.read_ns + self.close_ns

    @property
    def MBps(self) -> float:
        return self.bytes / self.ns * 1e3 if self.ns else float("nan")


def timed_read(path: str | os.PathLike[str], chunk: int = CHUNK) -> Spans:
    """Read a whole file (local, Drive or gcsfuse mount) and time its spans; bytes are what the
    reads returned."""
    t0 = time.perf_counter_ns()
    fd = os.open(path, os.O_RDONLY)
    t1 = time.perf_counter_ns()
    try:
        n = len(os.read(fd, chunk))
        t2 = time.perf_counter_ns()
        while data := os.read(fd, chunk):
            n += len(data)
        t3 = time.perf_counter_ns()
    finally:
        os.close(fd)
    t4 = time.perf_counter_ns()
    return Spans(n, t1 - t0, t2 - t1, t3 - t1, t4 - t3)


def time_h2d(data: bytes, repeats: int = 10) -> list[dict[str, Any]] | str:
    """Host-to-device copies of one loaded batch, pageable and pinned, each timed between
    ``torch.cuda.synchronize()`` calls after a warm-up copy. Returns rows (``method``
    ``h2d-pageable`` / ``h2d-pinned``, ``phase`` ``h2d``), or a one-line note where there is no CUDA."""
    try:
        import torch
    except ImportError:
        return "GPU copies skipped: torch is not installed"
    if not torch.cuda.is_available():
        return "GPU copies skipped: no CUDA device here (torch.cuda.is_available() is False)"
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = []
    for method, tensor in (("h2d-pageable", host), ("h2d-pinned", host.pin_memory())):
        tensor.to("cuda", non_blocking=False)  # warm-up: context, allocator
        torch.cuda.synchronize()
        for repeat in range(1, repeats + 1):
            t0 = time.perf_counter_ns()
            tensor.to("cuda", non_blocking=method == "h2d-pinned")
            torch.cuda.synchronize()
            ns = time.perf_counter_ns() - t0
            rows.append({"method": method, "phase": "h2d", "file": f"({len(data)} B batch)", "bytes": len(data),
                         "file_bytes": len(data), "repeat": repeat, "pass": 1, "concurrency": 1, "ns": ns,
                         "cache_state": "page_warm", "eviction": torch.cuda.get_device_name(0)})
    return rows
