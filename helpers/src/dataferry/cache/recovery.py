"""Recovery and verification: what crashed processes left is cleaned when a cache opens, and
``verify`` / ``clear`` are safe beside other processes that fill, read and evict.

A file is an orphan only if no row names it while its fill lock is held (a fill holds it from
before its file exists until its row does: a reserved fill's row comes first, a leased fill's after
its rename, once durable); a temp file is a live fill's unless its process died; a ready row whose
file is gone is dropped; a fill whose process died is finished (a right-sized file was verified and
made durable before its rename) or dropped.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from dataferry.cache import entries
from dataferry.cache.checksum import file_crc
from dataferry.cache.index import Index
from dataferry.cache.layout import Layout
from dataferry.cache.locks import FillLocks
from dataferry.cache.store import release
from dataferry.host import pid_alive

__all__ = ["recover", "verify", "clear", "VerifyReport"]


@dataclass
class VerifyReport:
    """What :meth:`Cache.verify` checked and removed."""

    checked: int = 0
    bad: list[tuple[str, str, str]] = field(default_factory=list)  # (source, name, why)
    orphans_removed: int = 0

    @property
    def ok(self) -> bool:
        return not self.bad

    def __repr__(self) -> str:
        return f"VerifyReport(checked={self.checked}, bad={len(self.bad)}, orphans_removed={self.orphans_removed})"


def recover(layout: Layout, index: Index, locks: FillLocks) -> None:
    """Clean what crashed processes left: dead fills' temp files and index rows, rows whose
    file is missing, and files no row names (evicted by a process that died before unlinking)."""
    with contextlib.suppress(FileNotFoundError):
        _drop_dead_temp_files(layout.old_tmp, os.listdir(layout.old_tmp))
    _finish_dead_fills(layout, index)
    for sub in layout.shelves():
        files = _drop_dead_temp_files(layout.shelf(sub), os.listdir(layout.shelf(sub)))
        rows = entries.shelf_states(index.db(), sub)
        missing = [k for k, state in rows.items() if state == "ready" and k not in files]
        if missing:
            with index.write() as db:
                entries.drop_missing(db, missing)
        for name in files - rows.keys():
            _remove_orphan(layout, index, locks, sub, name)
    with index.write() as db:
        entries.recount(db)


def _drop_dead_temp_files(folder: str, names: list[str]) -> set[str]:
    """Unlink the temp files in ``folder`` of processes that died; the names that are not temp files."""
    others = set()
    for name in names:
        pid = Layout.temp_pid(name)
        if pid < 0:
            others.add(name)
        elif pid != os.getpid() and not pid_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{folder}/{name}")
    return others


def _finish_dead_fills(layout: Layout, index: Index) -> None:
    doomed: list[tuple[str, int]] = []
    with index.write() as db:
        entries.reclaim_dead_fills(db, layout, doomed)
    release(doomed, unlink=True)


def _remove_orphan(layout: Layout, index: Index, locks: FillLocks, sub: str, name: str) -> bool:
    """Unlink ``objects/sub/name`` if no row names it. Its fill lock is held meanwhile: a fill
    holds it until its row exists, so a fill in progress is never taken for an orphan."""
    with locks.hold(name):
        if entries.is_named(index.db(), name):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{layout.shelf(sub)}/{name}")
        return True


def verify(layout: Layout, index: Index, locks: FillLocks) -> VerifyReport:
    """Re-read every cached object and check size and CRC32C; remove bad entries (they are
    fetched again on the next read) and files the index does not know. Safe while other
    processes fill, read and evict: an entry evicted meanwhile is not bad, and a file is an
    orphan only if no row names it while its fill lock is held; fills of processes that died
    are finished or dropped first."""
    index.flush()
    _finish_dead_fills(layout, index)
    report = VerifyReport()
    for sub in layout.shelves():
        rows = entries.ready_on_shelf(index.db(), sub)
        for key, source, name, size, crc in rows:
            try:
                n, got = file_crc(Path(layout.object_path(key)))
            except FileNotFoundError:
                if entries.is_ready(index.db(), key):
                    report.checked += 1
                    report.bad.append((source, name, "file missing"))
                    index.discard(key)
                continue  # evicted meanwhile: not bad
            report.checked += 1
            why = (f"size {n}, expected {size}" if n != size
                   else f"crc32c {got}, expected {crc}" if crc and got != crc else "")
            if why:
                report.bad.append((source, name, why))
                index.discard(key)
        known = {row[0] for row in rows}
        for name in os.listdir(layout.shelf(sub)):
            if name not in known and Layout.temp_pid(name) < 0 and _remove_orphan(layout, index, locks, sub, name):
                report.orphans_removed += 1
    return report


def clear(layout: Layout, index: Index) -> None:
    """Remove every ready entry. Fills in progress keep theirs; files being read stay readable
    until closed. The index lock is held only to delete rows, never while files are removed."""
    index.flush()
    with index.write() as db:
        keys = entries.clear_ready(db)
    release([(layout.object_path(key), -1) for key in keys], unlink=True)
    index.forget_uses()
