"""The cache's promises at the edges: torn folder copies, odd names, overwrites between stat and
download, forks while a thread holds a lock, and the small things a user sees (issue: trust at the
edges). Real folders, real lab buckets, real forks; nothing is mocked."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dataferry import Cache, GCSSource, LocalSource, stage
from dataferry.cache.requests import Flush, Reserve, Stop, Touch
from dataferry.cache.store import Row
from dataferry.sources import ChangedAtSource, Entry, from_uri

CHUNK = 1 << 20


def _old_file(path: Path, data: bytes) -> None:
    """A file written a while ago (so that a rewrite now changes its mtime on any clock tick)."""
    path.write_bytes(data)
    past = time.time() - 3600
    os.utime(path, (past, past))


class RewritingSource(LocalSource):
    """A folder whose file is rewritten in place, same size, after the first MiB of a copy: what a
    sync client or a second notebook does to a Drive folder while the cache copies it."""

    def __init__(self, root: Path, new: bytes) -> None:
        super().__init__(root)
        self.new = new

    def fetch(self, entry: Entry, out, start: int = 0) -> int:
        source = self

        class Out:
            def __init__(self) -> None:
                self.n = 0

            def write(self, data: bytes) -> int:
                if self.n == 0 and source.new is not None:
                    with open(source.root / entry.name, "r+b") as f:
                        f.write(source.new)
                    source.new = None
                self.n += len(data)
                return out.write(data)

        return super().fetch(entry, Out(), start)


def test_a_folder_file_rewritten_during_its_copy_is_never_cached_as_a_mix(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    old, new = os.urandom(4 * CHUNK), os.urandom(4 * CHUNK)
    _old_file(root / "big.bin", old)
    source = RewritingSource(root, new)
    entry = source.stat("big.bin")
    cache = Cache(tmp_path / "c", min_free_bytes=0, retry_deadline_s=5)
    with pytest.raises(ChangedAtSource, match=r"big\.bin.*changed while it was copied"):
        cache.read(source, entry)
    assert cache.usage() == (0, 0), "nothing half-old, half-new was cached"
    assert cache.read(source, "big.bin") == new, "read by name: the current version, whole"


def test_folder_entries_are_verified_by_the_crc32c_computed_while_copying(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    _old_file(root / "a.bin", os.urandom(100_000))
    source, cache = LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0)
    cache.read(source, "a.bin")
    cached = cache.path(source, "a.bin")
    damaged = bytearray(cached.read_bytes())
    damaged[50_000] ^= 1  # same size: only a checksum can tell
    cached.write_bytes(damaged)
    report = cache.verify()
    assert [(name, why.split(",")[0]) for _, name, why in report.bad] == [("a.bin", f"crc32c {why_crc(damaged)}")]


def why_crc(data: bytes) -> str:
    import base64

    import google_crc32c

    return base64.b64encode(google_crc32c.value(bytes(data)).to_bytes(4, "big")).decode()


def test_objects_whose_names_end_in_a_slash_keep_their_data(lab_env, lab_bucket, tmp_path):
    lab_bucket.blob("d/").upload_from_string(b"")                 # a folder placeholder: no data
    lab_bucket.blob("d/odd/").upload_from_string(b"real bytes")   # data under a name ending in '/'
    lab_bucket.blob("d/a.bin").upload_from_string(b"a")
    source = GCSSource(lab_bucket.name, "d/")
    assert sorted(e.name for e in source.list()) == ["a.bin", "odd/"]
    assert Cache(tmp_path / "c", min_free_bytes=0).read(source, "odd/") == b"real bytes"


def test_names_that_are_not_utf8_are_cached_and_staged_across_ranks(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for raw in (b"caf\xe9.bin", b"plain.bin", b"\xff\xfe.bin"):
        with open(os.path.join(os.fsencode(root), raw), "wb") as f:
            f.write(raw * 100)
    source, cache = LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0)
    names = sorted(e.name for e in source.list())
    assert cache.read(source, names[0]) == os.fsencode(names[0]) * 100
    reports = [stage(source, Cache(tmp_path / "c2", min_free_bytes=0), rank=r, world_size=2, progress=False)
               for r in (0, 1)]
    assert sum(r.files for r in reports) == 3 and not any(r.failures for r in reports)


def test_a_read_by_name_survives_an_overwrite_between_its_stat_and_its_download(lab_env, lab_bucket, tmp_path):
    lab_bucket.blob("x/obj").upload_from_string(b"v1" * 1000)
    source = GCSSource(lab_bucket.name, "x/")
    stat = source.stat

    def stat_then_overwrite(name: str) -> Entry:
        entry = stat(name)
        if not getattr(stat_then_overwrite, "done", False):
            stat_then_overwrite.done = True
            lab_bucket.blob("x/obj").upload_from_string(b"v2" * 1000)  # someone uploads a new version now
        return entry

    source.stat = stat_then_overwrite
    assert Cache(tmp_path / "c", min_free_bytes=0).read(source, "obj") == b"v2" * 1000


def test_a_child_forked_while_a_thread_holds_the_stats_lock_does_not_hang(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.bin").write_bytes(b"x" * 1000)
    source, cache = LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0)
    cache.read(source, "a.bin")  # a hit from now on
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._counters.mutex:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker reading a hit
        try:
            os._exit(0 if cache.read(source, "a.bin") == b"x" * 1000 else 1)
        except BaseException:
            os._exit(2)
    release.set()
    t.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on a lock its parent's thread held at fork time")


def test_messages_separate_the_source_from_the_name(tmp_path):
    root = tmp_path / "x"
    root.mkdir()
    (root / "sub").mkdir()
    (root / "sub" / "x.bin").write_bytes(b"1")
    source = LocalSource(root)
    entry = source.stat("sub/x.bin")
    (root / "sub" / "x.bin").write_bytes(b"22")
    with pytest.raises(ChangedAtSource) as e:
        Cache(tmp_path / "c", min_free_bytes=0).read(source, entry)
    assert f"{root.as_uri()}/sub/x.bin" in str(e.value)


def test_a_prefix_without_a_slash_is_a_folder_not_a_name_prefix(lab_env, lab_bucket):
    for name in ("train/a.bin", "train_old/b.bin", "train/c/d.bin"):
        lab_bucket.blob(name).upload_from_string(b"1")
    for uri in (f"gs://{lab_bucket.name}/train", f"gs://{lab_bucket.name}/train/"):
        source = from_uri(uri)
        assert source.uri == f"gs://{lab_bucket.name}/train/"
        assert sorted(e.name for e in source.list()) == ["a.bin", "c/d.bin"]


def test_gcsfuse_config_survives_paths_with_yaml_syntax(tmp_path):
    from dataferry.mounts.gcsfuse import _config_text

    text = _config_text({"cache-dir": str(tmp_path / "a: b #c"), "file-cache": {"max-size-mb": -1}})
    import yaml

    assert yaml.safe_load(text) == {"cache-dir": str(tmp_path / "a: b #c"), "file-cache": {"max-size-mb": -1}}


def test_cli_cache_commands_refuse_a_folder_that_is_not_a_cache(tmp_path):
    exe = str(Path(sys.executable).parent / "dataferry")
    for command in (["inspect"], ["verify"], ["prune", "--max-bytes", "0"], ["clear"]):
        proc = subprocess.run([exe, "cache", *command, str(tmp_path / "typo")], capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "is not a dataferry cache" in proc.stderr
        assert not (tmp_path / "typo").exists(), f"`cache {command[0]}` created a cache at a mistyped path"


@pytest.fixture
def read_only_cache(tmp_path):
    """A cache made, filled, then seen through a read-only bind mount (a read-only folder, even to root)."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.bin").write_bytes(b"x" * 1000)
    Cache(tmp_path / "rw", min_free_bytes=0).read(LocalSource(root), "a.bin")
    (tmp_path / "ro").mkdir()
    if subprocess.run(["mount", "--bind", str(tmp_path / "rw"), str(tmp_path / "ro")]).returncode != 0:
        pytest.skip("bind mounts need root")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(tmp_path / "ro")], check=True)
        yield tmp_path / "ro", LocalSource(root)
    finally:
        subprocess.run(["umount", str(tmp_path / "ro")], check=True)


def test_a_read_only_cache_folder_is_one_clear_error(read_only_cache):
    from dataferry.cache import CacheFolderError

    ro, source = read_only_cache
    with pytest.raises(CacheFolderError, match=r"cannot write to the cache folder .*ro.*choose a writable folder"):
        Cache(ro).read(source, "a.bin")
    assert issubclass(CacheFolderError, OSError)
    proc = subprocess.run([str(Path(sys.executable).parent / "dataferry"), "cache", "inspect", str(ro)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "cannot write" in proc.stderr, proc.stderr


def test_bench_cache_leaves_the_environment_as_it_found_it(monkeypatch):
    from benchmarks.cache import _lab_environment

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with _lab_environment({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"}):
        assert os.environ["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:1"
    assert "STORAGE_EMULATOR_HOST" not in os.environ
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "mine")
    with _lab_environment({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"}):
        pass
    assert os.environ["STORAGE_EMULATOR_HOST"] == "mine"


def test_an_error_of_the_caches_own_disk_is_not_retried_as_a_network_blip(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.bin").write_bytes(b"x" * 3 * CHUNK)
    cache = Cache(tmp_path / "c", min_free_bytes=0, retry_deadline_s=30)

    def bad_disk(*args):
        raise OSError(5, "Input/output error")  # EIO from the cache's own disk

    from dataferry.cache import transport

    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transport.os, "pwrite", bad_disk)  # every write of a fill to its temp file
        with pytest.raises(OSError, match="cache's disk"):
            cache.fill(LocalSource(root), "a.bin")
    assert time.monotonic() - t0 < 5, "not retried for the deadline: the network is not the problem"


def test_listing_with_the_link_down_fails_within_the_deadline_with_the_fills_error_type(lab, lab_env, lab_bucket):
    from dataferry.sources import SourceError

    lab_bucket.blob("d/a.bin").upload_from_string(b"a")
    source = GCSSource(lab_bucket.name, "d/", retry_deadline_s=3)
    lab.toxiproxy.add_toxic("gcs", {"name": "down", "type": "reset_peer", "toxicity": 1.0, "attributes": {"timeout": 0}})
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"listing gs://.*/d/ kept failing for \d+(\.\d)? s \(\d+ attempts; last "
                                              r"error: .*\)\. Check the connection"):
            list(source.list())
        assert time.monotonic() - t0 < 15
    finally:
        lab.toxiproxy.remove_toxic("gcs", "down")
    assert [e.name for e in source.list()] == ["a.bin"], "and lists again once the link is back"


def _filled(tmp_path, n=20, size=10_000, **budget):
    root = tmp_path / "src"
    root.mkdir(exist_ok=True)
    for i in range(n):
        (root / f"f{i:03d}.bin").write_bytes(bytes([i]) * size)
    source, cache = LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0, **budget)
    for i in range(n):
        cache.read(source, f"f{i:03d}.bin")
    cache._index.flush()
    return source, cache


def test_a_failed_eviction_transaction_deletes_no_file(tmp_path, monkeypatch):
    """Files go only after the rows that name them are committed: a statement that fails half-way
    (a full disk, a crash) rolls the rows back with every file still there."""
    import sqlite3

    source, cache = _filled(tmp_path)

    from dataferry.cache import budget

    lru = budget.lru

    def disk_full_mid_prune(db, batch=256):
        for i, victim in enumerate(lru(db, batch)):
            if i == 10:
                raise sqlite3.OperationalError("database or disk is full")
            yield victim

    monkeypatch.setattr(budget, "lru", disk_full_mid_prune)
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        Cache(tmp_path / "c", min_free_bytes=0).prune(0)
    monkeypatch.setattr(budget, "lru", lru)
    report = cache.verify()
    assert report.ok and report.checked == 20, report.bad


def test_rows_whose_file_is_missing_are_reconciled_when_the_cache_opens(tmp_path):
    source, cache = _filled(tmp_path)
    gone = cache.path(source, "f003.bin")
    gone.unlink()  # what the old eviction left after a rollback, or a person cleaning up by hand
    stray = gone.parent / ("0" * 64)
    stray.write_bytes(b"not in the index")
    reopened = Cache(tmp_path / "c", min_free_bytes=0)
    assert reopened.usage() == (19, 19 * 10_000), "the index counts only bytes that exist"
    assert not stray.exists(), "a file no row names is removed"
    assert reopened.verify().ok


def test_verify_while_another_process_fills_deletes_nothing_good(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(400):
        (root / f"f{i:04d}.bin").write_bytes(os.urandom(2_000))
    script = (f"from dataferry import Cache, LocalSource, stage\n"
              f"stage(LocalSource({str(root)!r}), Cache({str(tmp_path / 'c')!r}, min_free_bytes=0), workers=4, progress=False)\n")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    filler = subprocess.Popen([sys.executable, "-c", script])
    reports = []
    while filler.poll() is None:
        reports.append(cache.verify())
    filler.wait()
    reports.append(cache.verify())
    assert filler.returncode == 0
    assert all(r.ok and r.orphans_removed == 0 for r in reports), [r for r in reports if not r.ok or r.orphans_removed]
    assert cache.usage() == (400, 400 * 2_000) and reports[-1].checked == 400


_DROPPED_WITH_WRITES_PENDING = """
import sqlite3, sys, threading, time
from dataferry import Cache, LocalSource

root, folder = sys.argv[1:3]
gates = {"a.bin": threading.Event(), "b.bin": threading.Event()}

class Gated(LocalSource):
    def fetch(self, entry, out, start=0, timeout=None):
        gates[entry.name].wait()
        return super().fetch(entry, out, start)

cache, source = Cache(root, min_free_bytes=0, max_bytes=10**9), Gated(folder)  # capped: each fill reserves its own row
fills = [threading.Thread(target=cache.fill, args=(source, source.stat(n))) for n in gates]
for t in fills:
    t.start()
index = sqlite3.connect(root + "/index.sqlite", isolation_level=None)
while index.execute("SELECT count(*) FROM entries WHERE state = 'filling'").fetchone()[0] < 2:
    time.sleep(0.01)
index.execute("BEGIN IMMEDIATE")  # the index writer waits behind this (another process, say)
gates["a.bin"].set()
fills[0].join()
time.sleep(0.5)  # a's "ready" is taken by the index writer, which now waits for the lock
gates["b.bin"].set()
fills[1].join()
del cache, fills  # the caller is done with the cache: b's "ready" is still queued
index.execute("COMMIT")
time.sleep(0.5)
"""


def test_a_cache_dropped_with_writes_pending_applies_them_before_exit(tmp_path):
    """stage(source, Cache(...)) drops its cache when it returns: every fill it finished must still
    be marked ready, whether the cache is collected first or the process exits first."""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in ("a.bin", "b.bin"):
        (folder / name).write_bytes(os.urandom(5_000))
    subprocess.run([sys.executable, "-c", _DROPPED_WITH_WRITES_PENDING, str(tmp_path / "c"), str(folder)],
                   check=True, timeout=120)
    states = dict(sqlite3.connect(tmp_path / "c" / "index.sqlite").execute("SELECT name, state FROM entries"))
    assert states == {"a.bin": "ready", "b.bin": "ready"}


def test_verify_finishes_the_fills_of_processes_that_died(tmp_path):
    """A filler SIGKILLed after its rename, before its row was marked ready: verify checks that
    file as the entry it is (and drops a torn one), rather than skipping both."""
    source, cache = _filled(tmp_path, n=3)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    whole, torn = (source.stat(name) for name in ("f000.bin", "f001.bin"))
    for entry, data in ((whole, bytes([0]) * 10_000), (torn, b"x" * 10)):
        key = cache.key(source, entry)
        cache._index.discard(key)
        with cache._index.write() as db:
            db.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?, NULL, 'filling', ?, 0, 0)",
                       (key, source.uri, entry.name, entry.version, entry.size, dead))
        Path(cache._layout.object_path(key)).write_bytes(data)
    report = cache.verify()
    assert report.ok and report.checked == 2, report
    assert {e["name"]: e["state"] for e in cache.entries()} == {"f000.bin": "ready", "f002.bin": "ready"}
    assert cache.usage() == (2, 20_000)


def test_clear_removes_only_what_it_cleared(tmp_path):
    source, cache = _filled(tmp_path, n=5)
    entry = source.stat("f000.bin")
    key = cache.key(source, entry)
    cache._index.discard(key)
    from dataferry.cache.sides import run_here

    now = time.time()
    row = Row(key, source.uri, entry.name, entry.version, entry.size, None, os.getpid(), now, now)
    assert run_here(cache._fills.on_thread.reserve(row)) is None  # a fill in progress (another process's, say)
    Path(cache._layout.object_path(key)).write_bytes(bytes([0]) * 10_000)  # renamed into place, not yet ready
    cache.clear()
    assert Path(cache._layout.object_path(key)).exists(), "a fill in progress keeps its file"
    assert cache.usage() == (1, 10_000)


def test_a_dead_fillers_reservation_is_reclaimed_where_room_is_decided(tmp_path):
    source, cache = _filled(tmp_path, n=2, max_bytes=30_000)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    with cache._index.write() as db:  # a filler that reserved 15 kB and was then SIGKILLed
        db.execute("INSERT INTO entries VALUES ('dead', 'x', 'y', 'v', 15000, NULL, 'filling', ?, 0, 0)", (int(dead),))
    (tmp_path / "src" / "big.bin").write_bytes(b"b" * 9_000)
    with warnings_as_errors():
        assert cache.read(source, "big.bin") == b"b" * 9_000, "fits once the dead reservation is gone"
    assert cache.usage() == (3, 29_000)


def warnings_as_errors():
    import warnings

    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error")

    class _Ctx:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            ctx.__exit__(*exc)

    return _Ctx()


async def ask_on_the_loop(writer):
    import asyncio

    answer = asyncio.get_running_loop().create_future()
    writer.ask(Reserve(("row",)), answer)
    return await answer


def test_a_failed_index_batch_loses_no_unrelated_update_and_a_dead_writer_is_an_error(tmp_path):
    source, cache = _filled(tmp_path, n=3)
    writer = cache._index.writer
    writer._put(Touch(None))  # one bad item (a None where uses belong) in the next batch
    (tmp_path / "src" / "new.bin").write_bytes(b"n" * 100)
    cache.read(source, "new.bin")
    cache._index.flush()
    states = dict(cache._index.db().execute("SELECT name, state FROM entries").fetchall())
    assert states["new.bin"] == "ready", "an unrelated fill was marked ready despite the bad item"
    writer._put(Stop())  # the writer thread ends (as if it had crashed)
    writer._thread.join(5)
    assert not writer._thread.is_alive()
    from concurrent.futures import Future

    queued = Future()
    writer._put(Flush(), queued)  # a request the dead writer will never answer
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="index writer .* stopped"):
        writer._wait(queued)
    assert time.monotonic() - t0 < 10, "no wait forever on a dead writer"
    from dataferry import aio

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="index writer .* stopped"):
        aio.run(ask_on_the_loop(writer))  # the download loop's kind of request, too
    assert time.monotonic() - t0 < 10, "no wait forever on a dead writer from the download loop"
    (tmp_path / "src" / "later.bin").write_bytes(b"l" * 100)
    assert cache.read(source, "later.bin") == b"l" * 100, "later fills get a new writer"
    cache._index.flush()
    assert dict(cache._index.db().execute("SELECT name, state FROM entries").fetchall())["later.bin"] == "ready"


@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB file system (tmpfs; mounting needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill_disk(ballast: Path) -> None:
    """Write ``ballast`` until its disk has no room left."""
    with open(ballast, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()


class FillsTheDiskMidCopy(LocalSource):
    """A folder whose copy is interrupted by something else filling the cache's disk: another
    program's download, a checkpoint, a log."""

    def __init__(self, root: Path, ballast: Path) -> None:
        super().__init__(root)
        self.ballast, self.filled = ballast, False

    def fetch(self, entry: Entry, out, start: int = 0) -> int:
        if not self.filled:
            self.filled = True
            _fill_disk(self.ballast)
        return super().fetch(entry, out, start)


def test_a_disk_that_fills_up_mid_fill_streams_with_a_warning_and_corrupts_nothing(tmp_path, small_disk):
    import warnings

    from dataferry.cache import CacheFullWarning

    root = tmp_path / "src"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(3 << 20))
    (root / "b.bin").write_bytes(os.urandom(2 << 20))
    cache = Cache(small_disk / "c", min_free_bytes=0, retry_deadline_s=5)
    cache.read(LocalSource(root), "b.bin")
    source = FillsTheDiskMidCopy(root, small_disk / "ballast")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.read(source, "a.bin") == (root / "a.bin").read_bytes()
    full = [w for w in caught if issubclass(w.category, CacheFullWarning)]
    assert full and "disk" in str(full[0].message) and str(small_disk / "c") in str(full[0].message)
    assert "free" in str(full[0].message)
    (small_disk / "ballast").unlink()
    report = cache.verify()
    assert report.ok and report.checked == 1 and cache.usage() == (1, 2 << 20)
    assert list((small_disk / "c").rglob("*.part")) == [], "no temp file left behind"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.read(source, "a.bin") == (root / "a.bin").read_bytes()
    assert cache.contains(source, source.stat("a.bin")) and cache.usage() == (2, 5 << 20), "cached once there is room"
    assert cache.verify().checked == 2


class FillsTheDiskBeforeItsFirstDownload(GCSSource):
    """A bucket whose first download starts just as something else fills the cache's disk."""

    def __init__(self, bucket: str, prefix: str, ballast: Path) -> None:
        super().__init__(bucket, prefix)
        self.ballast, self.filled = ballast, False

    async def fetch_async(self, entry: Entry, out, *args, **kwargs) -> int:
        if not self.filled:
            self.filled = True
            _fill_disk(self.ballast)
        return await super().fetch_async(entry, out, *args, **kwargs)


def test_a_disk_that_fills_up_while_staging_a_bucket_refuses_cleanly_and_corrupts_nothing(lab_env, lab_bucket,
                                                                                          tmp_path, small_disk):
    """The download loop's path (objects held in memory and written to disk in groups): a write
    refused by a full disk is a refusal that names the disk, with no temp file or row left."""
    from dataferry.course.lab import plan_dataset

    ds = plan_dataset(12, 100_000, prefix="d", seed=4, shard_bytes=None).upload(lab_bucket)
    cache = Cache(small_disk / "c", min_free_bytes=0, retry_deadline_s=5)
    source = FillsTheDiskBeforeItsFirstDownload(lab_bucket.name, "d/files/", small_disk / "ballast")
    filled = list(cache.fill_many(source, list(source.list())))
    assert len(filled) == 12 and all(f.fetched == -1 and f.error is None for f in filled), filled
    assert any("filled up during the download" in f.refusal for f in filled), [f.refusal for f in filled]
    assert list((small_disk / "c").rglob("*.part")) == [], "no temp file left behind"
    (small_disk / "ballast").unlink()
    assert cache.verify().ok and cache.usage() == (0, 0), "no row or file of a refused fill"
    report = stage(source, cache, progress=False)
    assert report.fetched == 12 and not report.failures
    assert all(cache.read(source, name) == ds.content(name) for name in ds.sizes)


def test_stage_waits_for_room_held_by_readers_and_names_the_limit_that_stops_it(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for name, size in (("a.bin", 10_000), ("b.bin", 10_000), ("c.bin", 15_000)):
        (root / name).write_bytes(b"z" * size)
    source = LocalSource(root)
    cache = Cache(tmp_path / "c", max_bytes=30_000, min_free_bytes=0)
    readers = [cache.open(source, "a.bin"), cache.open(source, "b.bin")]  # a DataLoader mid-batch
    threading.Timer(1.0, readers[0].close).start()
    t0 = time.monotonic()
    report = stage(source, cache, ["c.bin"], progress=False)
    assert report.failures == [] and report.fetched == 1, report.failures
    assert 0.9 < time.monotonic() - t0 < 8, "it waited for the reader, and no longer"
    readers[1].close()

    whole_disk = shutil.disk_usage(tmp_path).total  # the most it takes; always more than is free
    strict = Cache(tmp_path / "c2", min_free_bytes=whole_disk)
    report = stage(source, strict, ["a.bin"], progress=False)
    assert len(report.failures) == 1
    assert f"min_free_bytes={whole_disk} would be crossed" in report.failures[0][1]
    report = stage(source, Cache(tmp_path / "c3", max_bytes=5_000, min_free_bytes=0), ["a.bin"], progress=False)
    assert "larger than the whole budget (max_bytes=5000)" in report.failures[0][1]


def test_the_retry_deadline_bounds_a_fill_on_a_blackholed_link(lab, lab_env, lab_bucket, tmp_path):
    from dataferry.sources import SourceError

    lab_bucket.blob("x/obj").upload_from_string(os.urandom(1 << 20))
    source = GCSSource(lab_bucket.name, "x/")
    entry = source.stat("obj")
    cache = Cache(tmp_path / "c", min_free_bytes=0, retry_deadline_s=3)
    toxic = {"name": "blackhole", "type": "timeout", "stream": "downstream", "toxicity": 1.0, "attributes": {"timeout": 0}}
    lab.toxiproxy.add_toxic("gcs", toxic)  # nothing ever comes back
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"gs://.*/x/obj: the source kept failing for [3-6] s \(\d+ attempts; "
                                              r".*nothing was cached"):
            cache.read(source, entry)
        assert time.monotonic() - t0 < 10, "bounded by the deadline, not by the client's 60 s timeouts"
    finally:
        lab.toxiproxy.remove_toxic("gcs", "blackhole")
    assert cache.usage() == (0, 0)


@pytest.fixture
def trickling_endpoint():
    """A real HTTP server answering GCS media downloads at 16 KB/s (512 bytes every 32 ms): a link
    that never stalls and never finishes in time. (toxiproxy's bandwidth and slicer toxics make its
    API wait for the chunk they hold, longer than its own timeout.)"""
    import http.server
    import socketserver

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range((1 << 20) // 512):
                    self.wfile.write(b"t" * 512)
                    self.wfile.flush()
                    time.sleep(0.032)

        def log_message(self, *args):
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_retry_deadline_bounds_a_fill_on_a_trickling_link(trickling_endpoint, tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from dataferry.sources import SourceError

    client = storage.Client(project="x", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": trickling_endpoint})
    source = GCSSource("b", "x/", client=client)
    entry = Entry("obj", 1 << 20, "1", None)
    cache = Cache(tmp_path / "c", min_free_bytes=0, retry_deadline_s=3)
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"gs://b/x/obj: the download did not finish within [3-6] s \(1 attempt; "
                                          r".*nothing was cached"):
        cache.read(source, entry)
    assert time.monotonic() - t0 < 10, "a link that keeps trickling cannot outlast the deadline"
    assert cache.usage() == (0, 0) and list((tmp_path / "c").rglob("*.part")) == []


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "no-follow walk"])
def test_a_folder_swapped_for_a_link_between_check_and_open_cannot_lead_outside(tmp_path, monkeypatch, openat2):
    import io
    import shutil

    import dataferry.sources.beneath

    monkeypatch.setattr(dataferry.sources.beneath, "_HAS_OPENAT2", openat2)

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "x.bin").write_bytes(b"inside")
    outside.mkdir()
    (outside / "x.bin").write_bytes(b"SECRET")
    source = LocalSource(root, follow_links=False)
    entry = source.stat("sub/x.bin")
    real = os.path.realpath

    def check_then_swap(path, *args, **kwargs):  # the other process wins the race right after a check
        answer = real(path, *args, **kwargs)
        if not (root / "sub").is_symlink():
            shutil.rmtree(root / "sub")
            (root / "sub").symlink_to(outside)
        return answer

    monkeypatch.setattr(os.path, "realpath", check_then_swap)
    out = io.BytesIO()
    with contextlib.suppress(ValueError, OSError):
        source.fetch(entry, out)
    assert b"SECRET" not in out.getvalue()
    monkeypatch.setattr(os.path, "realpath", real)
    if not (root / "sub").is_symlink():  # this implementation never checked: swap now, before the open
        shutil.rmtree(root / "sub")
        (root / "sub").symlink_to(outside)
    with pytest.raises(ValueError, match="leads outside"):
        source.fetch(entry, io.BytesIO())
    with pytest.raises(ValueError, match="leads outside"):
        source.stat("sub/x.bin")


class ManyObjects:
    """A source of n objects listed from memory, bytes made on demand: a bucket the size of a big
    training set, without the bucket (listing is what this measures)."""

    def __init__(self, n: int) -> None:
        self.n, self.uri = n, f"mem://{n}/"

    def list(self):
        for i in range(self.n):
            yield Entry(f"train/{i // 1000:05d}/sample-{i:08d}.jpg", 50_000 + i % 97, str(1_700_000_000_000_000 + i),
                        "AAAAAA==")

    def stat(self, name: str) -> Entry:
        i = int(name.rsplit("-", 1)[1].split(".")[0])
        return next(e for j, e in enumerate(self.list()) if j == i)

    def fetch(self, entry: Entry, out, start: int = 0, timeout=None) -> int:
        return out.write(b"x" * (entry.size - start))


def test_a_big_listing_is_held_in_about_a_hundred_bytes_per_object():
    import pickle
    import tracemalloc

    from dataferry import CachedDataset

    n = 200_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ds = CachedDataset(ManyObjects(n), cache=None)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(ds) == n and ds.entries[123_456].name == "train/00123/sample-00123456.jpg"
    assert held / n < 100, f"{held / n:.0f} bytes per object (a list of Entry costs ~270)"
    assert len(pickle.dumps(ds)) / n < 100, "and so does what a spawned worker receives"


def test_the_prefetcher_keeps_only_what_is_in_flight(tmp_path):
    from dataferry import Prefetcher

    root = tmp_path / "src"
    root.mkdir()
    for i in range(2_000):
        (root / f"{i:05d}.bin").write_bytes(b"p")
    source = LocalSource(root)
    entries = sorted(source.list(), key=lambda e: e.name)
    with Prefetcher(source, Cache(tmp_path / "c", min_free_bytes=0), entries, ahead=16) as pf:
        for position in range(len(entries)):
            pf.advance(position)
        pf.wait()
        assert len(pf._futures) <= 16 + 4, f"{len(pf._futures)} futures kept for an epoch of {len(entries)}"


def test_a_same_size_rewrite_with_its_mtime_restored_is_a_new_version(tmp_path):
    """Size, mtime and inode can all be put back by a user (rsync -t, a restore, os.utime); the change
    time cannot: it is part of a file's version, so the rewrite is never served stale."""
    root = tmp_path / "src"
    root.mkdir()
    path = root / "a.bin"
    path.write_bytes(b"old" * 1000)
    source, cache = LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0)
    assert cache.read(source, "a.bin") == b"old" * 1000
    st = path.stat()
    time.sleep(0.01)
    with open(path, "r+b") as f:  # in place: same inode
        f.write(b"new" * 1000)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert cache.read(source, "a.bin") == b"new" * 1000


def test_a_caller_interrupted_while_it_waits_on_the_download_loop_stops_what_it_started():
    """Ctrl-C in a reader waiting for a bucket's bytes (``aio.run``): the coroutine on the loop is cancelled
    and has ended by the time the interrupt reaches the caller, so it writes no more into a temp file the
    caller then removes (the loop wrote on into it before)."""
    import asyncio
    import signal

    from dataferry import aio

    writes: list[float] = []

    async def downloading() -> None:
        while True:
            writes.append(time.monotonic())
            await asyncio.sleep(0.005)

    def ctrl_c(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            aio.run(downloading())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seen = len(writes)
    time.sleep(0.2)
    assert seen > 10 and len(writes) == seen, "nothing more written once the caller has its interrupt"
