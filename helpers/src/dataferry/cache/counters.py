"""Counters of one process's use of a cache: every part adds to them, :meth:`Cache.stats` copies them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

__all__ = ["CacheStats", "Counters"]


@dataclass
class CacheStats:
    """Counters of one process's use of a cache (each DataLoader worker keeps its own)."""

    hits: int = 0
    misses: int = 0
    bytes_from_source: int = 0
    bytes_from_cache: int = 0
    evictions: int = 0
    refetches: int = 0
    retries: int = 0
    streamed: int = 0
    wait_s: float = 0.0
    fetch_s: float = 0.0

    def __sub__(self, before: CacheStats) -> CacheStats:
        """What happened since ``before`` (an earlier :meth:`Cache.stats`): ``cache.stats() - before``."""
        return CacheStats(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(CacheStats)})

    def __repr__(self) -> str:
        return (f"CacheStats(hits={self.hits}, misses={self.misses}, from_source={self.bytes_from_source / 1e6:.1f} MB, "
                f"from_cache={self.bytes_from_cache / 1e6:.1f} MB, evictions={self.evictions}, "
                f"refetches={self.refetches}, retries={self.retries}, streamed={self.streamed}, "
                f"wait={self.wait_s:.2f} s, fetch={self.fetch_s:.2f} s)")


class Counters:
    """A :class:`CacheStats` that many threads add to."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self._stats = CacheStats()

    def __repr__(self) -> str:
        return f"<Counters {self._stats!r}>"

    def add(self, **delta: float) -> None:
        with self.mutex:
            for name, value in delta.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)

    def copy(self) -> CacheStats:
        with self.mutex:
            return CacheStats(**{f.name: getattr(self._stats, f.name) for f in fields(CacheStats)})
