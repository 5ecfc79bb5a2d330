"""The cache's index under stress and damage: many processes opening it at once, a file that is no
longer a database, totals that drifted from the rows. It never crashes a reader; what it cannot
keep it says, in one line."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from dataferry import Cache, LocalSource
from dataferry.cache import CacheIndexWarning


def _source(tmp_path: Path, n: int = 12, size: int = 5_000) -> LocalSource:
    root = tmp_path / "src"
    root.mkdir(exist_ok=True)
    for i in range(n):
        (root / f"f{i:03d}.bin").write_bytes(bytes([i]) * size)
    return LocalSource(root)


OPENER = textwrap.dedent("""
    import os, sys, time
    from dataferry import Cache, LocalSource
    src, base, rounds = LocalSource(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    names = sorted(e.name for e in src.list())
    print("ready", flush=True)
    for r in range(rounds):
        while not os.path.exists(f"{base}/go{r}"):  # every process opens round r's new cache at once
            time.sleep(0.0005)
        cache = Cache(f"{base}/cache{r}", min_free_bytes=0, max_bytes=40_000)
        for name in names[r % 3::3]:
            assert cache.read(src, name) == open(f"{sys.argv[1]}/{name}", "rb").read()
        cache._index.flush()
""")


def test_sixteen_processes_opening_and_filling_one_cache_at_once_never_see_database_is_locked(tmp_path):
    """Each of 20 rounds: 16 processes open a new cache folder at the same instant (its index is made and
    switched to WAL by whoever comes first) and fill it. Seen before: 'database is locked' at the WAL pragma."""
    src = _source(tmp_path, n=30)
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(src.root), str(tmp_path), "20"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(16)]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    for r in range(20):
        (tmp_path / f"go{r}").touch()
        time.sleep(0.25)
    errors = [err for p in procs for _, err in [p.communicate(timeout=300)] if p.returncode != 0]
    assert not errors, f"{len(errors)} of 16 processes failed: {errors[0][-3000:]}"
    for r in range(20):
        assert Cache(tmp_path / f"cache{r}", min_free_bytes=0).verify().ok


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_index_is_set_aside_with_one_line_and_the_cache_works_again(tmp_path, damage):
    src = _source(tmp_path)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    for e in src.list():
        cache.read(src, e)
    cache._index.flush()
    del cache
    index = tmp_path / "c" / "index.sqlite"
    for extra in ("-wal", "-shm"):
        Path(f"{index}{extra}").unlink(missing_ok=True)
    if damage == "garbage":
        index.write_bytes(b"\x13\x37 not a database " * 300)
    else:
        data = index.read_bytes()
        index.write_bytes(data[: len(data) // 3])
    with pytest.warns(CacheIndexWarning, match=r"index.*damaged.*set aside as .*index\.sqlite\.damaged"):
        cache = Cache(tmp_path / "c", min_free_bytes=0)
    assert list((tmp_path / "c").glob("index.sqlite.damaged*")), "the damaged file is kept for a post-mortem"
    for e in src.list():
        assert cache.read(src, e) == (src.root / e.name).read_bytes()
    assert cache.verify().ok and cache.usage() == (12, 12 * 5_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Cache(tmp_path / "c", min_free_bytes=0)  # set aside once: the next open is quiet


def test_cli_on_a_damaged_index_says_so_in_one_line(tmp_path):
    src = _source(tmp_path)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    cache.read(src, "f000.bin")
    cache._index.flush()
    del cache
    index = tmp_path / "c" / "index.sqlite"
    for extra in ("-wal", "-shm"):
        Path(f"{index}{extra}").unlink(missing_ok=True)
    index.write_bytes(b"garbage" * 1000)
    exe = str(Path(sys.executable).parent / "dataferry")
    proc = subprocess.run([exe, "cache", "verify", str(tmp_path / "c")], capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "sqlite3" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and "damaged" in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "damaged" in line]) == 1, proc.stderr


def test_usage_totals_that_drifted_from_the_rows_are_recomputed_when_the_cache_opens(tmp_path):
    src = _source(tmp_path)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    for e in src.list():
        cache.read(src, e)
    cache._index.flush()
    with cache._index.write() as db:  # a drift: what an older version or a hand edit could leave
        db.execute("UPDATE usage SET entries = entries + 7, bytes = bytes + 1000000000, filling_bytes = 55")
    reopened = Cache(tmp_path / "c", min_free_bytes=0, max_bytes=100_000)
    assert reopened.usage() == (12, 12 * 5_000)
    db = sqlite3.connect(tmp_path / "c" / "index.sqlite")
    assert db.execute("SELECT filling_bytes FROM usage").fetchone() == \
        db.execute("SELECT coalesce(sum(size), 0) FROM entries WHERE state = 'filling'").fetchone(), \
        "room held for fills in progress (the first cache's lease of room) is what the rows say"


PAGE = 4096


def _filled(tmp_path: Path, n: int = 300) -> tuple[LocalSource, Cache]:
    root = tmp_path / "src"
    root.mkdir(exist_ok=True)
    for i in range(n):
        (root / f"f{i:04d}.bin").write_bytes(bytes([i % 251]) * (1000 + i))
    src = LocalSource(root)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    for e in src.list():
        cache.read(src, e)
    cache._index.flush()
    return src, cache


def _every_call_works(src: LocalSource, cache: Cache, tmp_path: Path) -> None:
    """What a user does with a cache, none raising, every byte right."""
    from dataferry import stage

    for e in src.list():
        assert cache.read(src, e) == (src.root / e.name).read_bytes(), e.name
    assert stage(src, cache, progress=False).failures == []
    assert cache.usage()[0] == len(list(src.list()))
    assert len(cache.entries()) == len(list(src.list()))
    assert cache.verify().ok
    with cache.open(src, "f0007.bin") as f:
        assert f.read() == (src.root / "f0007.bin").read_bytes()


def _damage(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(range(256)) * (PAGE // 256))


def _sweep_cases(tmp_path: Path) -> tuple[LocalSource, Path, int, int]:
    """A cache of 300 entries whose index is checkpointed (every page in index.sqlite), copied aside with the
    WAL of one more batch of writes; how many pages each holds."""
    src, cache = _filled(tmp_path)
    db = sqlite3.connect(tmp_path / "c" / "index.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for e in list(src.list())[:50]:  # a batch of LRU times: a WAL of some frames
        cache.read(src, e)
    cache._index.rank_now({})
    cache._index.flush()
    pristine = tmp_path / "pristine"
    shutil.copytree(tmp_path / "c", pristine, ignore=shutil.ignore_patterns("*.lock"))
    db.close()
    pages = (pristine / "index.sqlite").stat().st_size // PAGE
    frames = max(((pristine / "index.sqlite-wal").stat().st_size - 32) // (PAGE + 24), 0)
    return src, pristine, pages, frames


def test_one_garbage_page_anywhere_in_the_index_or_its_wal_never_stops_a_cache_from_opening(tmp_path):
    """The sweep: one page of garbage at every page of the checkpointed index, and at the WAL's header and
    frames. Every case opens (set aside with at most one warning, or untouched), and no call raises or
    returns a wrong byte."""
    src, pristine, pages, frames = _sweep_cases(tmp_path)
    assert pages >= 20 and frames >= 1, (pages, frames)
    cases = [("index.sqlite", p * PAGE) for p in range(pages)]
    cases += [("index.sqlite-wal", 0)] + [("index.sqlite-wal", 32 + f * (PAGE + 24)) for f in range(frames)]
    failed = []
    for file, offset in cases:
        folder = tmp_path / f"case-{file}-{offset}"
        shutil.copytree(pristine, folder)
        _damage(folder / file, offset)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                _every_call_works(src, Cache(folder, min_free_bytes=0), tmp_path)
            noted = [w for w in seen if issubclass(w.category, CacheIndexWarning)]
            assert len(noted) <= 1, [str(w.message) for w in noted]
        except Exception as e:  # noqa: BLE001 - every case is reported
            failed.append(f"{file}@{offset}: {type(e).__name__}: {e}")
        shutil.rmtree(folder)
    assert not failed, f"{len(failed)} of {len(cases)} cases failed:\n" + "\n".join(failed)


def test_a_process_with_the_cache_open_recovers_from_a_page_damaged_under_it(tmp_path):
    """The damage comes while the cache is open (another process's crash, a failing write): the next calls
    set the index aside with one warning and go on, with no restart and no raw sqlite3 error."""
    src, cache = _filled(tmp_path, 300)
    index = tmp_path / "c" / "index.sqlite"
    sqlite3.connect(index).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
    pages = index.stat().st_size // PAGE
    failed = []
    for page in range(1, pages, 3):
        _damage(index, page * PAGE)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                _every_call_works(src, cache, tmp_path)
                _every_call_works(src, cache, tmp_path)
            assert len([w for w in seen if issubclass(w.category, CacheIndexWarning)]) <= 1
        except Exception as e:  # noqa: BLE001
            failed.append(f"page {page}: {type(e).__name__}: {e}")
        sqlite3.connect(index).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
    assert not failed, "\n".join(failed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _every_call_works(src, Cache(tmp_path / "c", min_free_bytes=0), tmp_path)
