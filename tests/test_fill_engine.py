"""The fast fill path keeps the cache's promises: a bucket's objects filled as coroutines on one
loop, large ones in parallel byte ranges, against the real lab (fake-gcs-server behind toxiproxy)."""

from __future__ import annotations

import os
import random
import threading
import time

import google_crc32c
import pytest
import requests

from dataferry import Cache, GCSSource, LocalSource, stage
from dataferry.cache import transport
from dataferry.cache.checksum import combine
from dataferry.course.lab import Profile, plan_dataset


def test_crc32c_of_consecutive_ranges_combines_to_the_whole():
    rng = random.Random(7)
    data = os.urandom(200_000)
    for _ in range(200):
        cuts = sorted(rng.sample(range(len(data)), rng.randrange(1, 6)))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        crc = google_crc32c.value(pieces[0])
        for piece in pieces[1:]:
            crc = combine(crc, google_crc32c.value(piece), len(piece))
        assert crc == google_crc32c.value(data)


@pytest.fixture
def small_ranges(monkeypatch):
    """Objects from 1 MiB up come in 256 KiB ranges, so a test needs no gigabyte object."""
    monkeypatch.setattr(transport, "RANGE_MIN", 1 << 20)
    monkeypatch.setattr(transport, "PART", 256 << 10)


def _ranged_gets(lab, name: str) -> int:
    return sum(1 for method, path, status in lab.requests() if method == "GET" and status == 206
               and name.replace("/", "%2F") in path)


def test_a_large_object_fills_in_verified_parallel_ranges(lab, lab_env, lab_bucket, tmp_path, small_ranges):
    data = os.urandom((3 << 20) + 12_345)  # a last range shorter than the rest
    lab_bucket.blob("big/obj").upload_from_string(data)
    source = GCSSource(lab_bucket.name, "big/")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    assert cache.read(source, "obj") == data
    assert _ranged_gets(lab, "big/obj") == 13, "one request per 256 KiB range"
    assert cache.verify().ok and cache.usage() == (1, len(data))


def test_a_large_object_starts_reaching_the_disk_while_it_downloads(lab, lab_env, lab_bucket, tmp_path, small_ranges,
                                                                    monkeypatch):
    """The pages of a large fill are sent to disk as its ranges arrive, not all left dirty in memory for the flush
    that makes the fill durable (512 MiB of it took ~1.6 s on this disk, after the last byte came)."""
    if transport._sync_file_range is None:
        pytest.skip("no sync_file_range on this system")
    monkeypatch.setattr(transport, "WRITEBACK", 64 << 10)
    started, real = [], transport._sync_file_range

    def recorded(fd, offset, nbytes, flags):
        started.append((os.readlink(f"/proc/self/fd/{fd}"), offset, nbytes))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(transport, "_sync_file_range", recorded)
    data = os.urandom((3 << 20) + 12_345)
    lab_bucket.blob("wb/obj").upload_from_string(data)
    source = GCSSource(lab_bucket.name, "wb/")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    cache.fill(source, "obj")
    assert started and all(path.endswith(".part") for path, _, _ in started), "started on the temp file, mid-fill"
    covered = sorted((offset, offset + n) for _, offset, n in started)
    assert all(a_end <= b for (_, a_end), (b, _) in zip(covered, covered[1:])), "each byte sent once"
    ranges = 13  # 256 KiB each: at most the last 64 KiB of each is left to the flush
    assert sum(end - start for start, end in covered) >= len(data) - ranges * (64 << 10)
    assert cache.read(source, "obj") == data and cache.verify().ok


def test_a_large_object_fills_faster_than_one_connection_carries(lab, lab_env, lab_bucket, tmp_path, small_ranges):
    data = os.urandom(4 << 20)
    lab_bucket.blob("fast/obj").upload_from_string(data)
    source = GCSSource(lab_bucket.name, "fast/")
    entry = source.stat("obj")
    lab.set_profile(Profile("test-narrow", 2, 4))  # 4 MB/s per connection
    t0 = time.perf_counter()
    with requests.get(f"{lab.endpoint}/download/storage/v1/b/{lab_bucket.name}/o/fast%2Fobj?alt=media",
                      timeout=60) as r:
        assert r.content == data
    one_connection_s = time.perf_counter() - t0
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    t0 = time.perf_counter()
    cache.fill(source, entry)
    fill_s = time.perf_counter() - t0
    assert one_connection_s / fill_s > 2, (one_connection_s, fill_s)
    assert cache.read(source, entry) == data


def test_ranges_cut_mid_transfer_resume_and_the_bytes_stay_right(lab, lab_env, lab_bucket, tmp_path, small_ranges):
    ds = plan_dataset(3, (2 << 20) + 777, prefix="cut", seed=4, shard_bytes=None).upload(lab_bucket)
    source = GCSSource(lab_bucket.name, "cut/files/")
    entries = list(source.list())
    cuts = {"name": "cuts", "type": "limit_data", "stream": "downstream", "toxicity": 1.0,
            "attributes": {"bytes": 100_000}}  # every connection dies within its first range
    lab.toxiproxy.add_toxic("gcs", cuts)
    try:
        cache = Cache(tmp_path / "c", min_free_bytes=0, retry_deadline_s=60)
        report = stage(source, cache, entries, progress=False)
    finally:
        lab.toxiproxy.remove_toxic("gcs", "cuts")
    assert report.failures == [] and report.fetched == 3
    assert cache.stats().retries > 0
    for e in entries:
        assert cache.read(source, e) == ds.content(e.name)
    assert cache.verify().ok


def test_staging_a_bucket_keeps_its_downloads_on_a_few_threads(lab, lab_env, lab_bucket, tmp_path):
    plan_dataset(300, 10_000, prefix="t", seed=2, shard_bytes=None).upload(lab_bucket)
    lab.set_profile(Profile("test-latency", 20, None))  # so that many downloads are in flight at once
    source = GCSSource(lab_bucket.name, "t/files/")
    entries = list(source.list())
    peak, stop = [threading.active_count()], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak.append(threading.active_count())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = stage(source, Cache(tmp_path / "c", min_free_bytes=0), entries, in_flight=64, progress=False)
    finally:
        stop.set()
        watcher.join()
    assert report.fetched == 300 and not report.failures
    assert max(peak) < 16, f"{max(peak)} threads for 64 downloads in flight"


def test_small_objects_reach_the_disk_off_the_download_loop(lab, lab_env, lab_bucket, tmp_path, monkeypatch):
    """The loop thread carries every download at once: a small object is held in memory and its
    file is created, written and renamed by a worker thread with the rest of its group, so the
    loop never waits on the disk (creating a file costs 0.1 ms of CPU in a fresh ext4 folder)."""
    plan_dataset(40, 20_000, prefix="s", seed=3, shard_bytes=None).upload(lab_bucket)
    source = GCSSource(lab_bucket.name, "s/files/")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    opened, real_open = [], os.open

    def watched_open(path, *args, **kwargs):
        if str(path).endswith(".part"):
            opened.append(threading.current_thread().name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", watched_open)
    report = stage(source, cache, progress=False)
    assert report.fetched == 40 and not report.failures
    assert len(opened) == 40 and "dataferry-aio" not in opened, opened
    assert cache.verify().ok and cache.usage() == (40, 40 * 20_000)


def test_the_loop_and_reading_threads_download_each_object_once(lab, lab_env, lab_bucket, tmp_path):
    ds = plan_dataset(120, 30_000, prefix="o", seed=9, shard_bytes=None).upload(lab_bucket)
    lab.set_profile(Profile("test-latency", 20, None))
    source = GCSSource(lab_bucket.name, "o/files/")
    entries = list(source.list())
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    got: dict[str, bytes] = {}

    def read_all(order: list) -> None:
        for e in order:
            got[e.name] = cache.read(source, e)

    readers = [threading.Thread(target=read_all, args=(random.Random(i).sample(entries, len(entries)),))
               for i in range(4)]
    for t in readers:
        t.start()
    report = stage(source, cache, entries, progress=False)
    for t in readers:
        t.join()
    assert not report.failures and report.fetched + report.already_cached == 120
    assert got == {name: ds.content(name) for name in ds.sizes}
    counts = lab.downloads(lab_bucket.name)
    assert len(counts) == 120 and set(counts.values()) == {1}, "one download per object, loop or thread"


def test_the_parent_keeps_downloading_after_a_forked_child_reads_and_exits(lab, lab_env, lab_bucket, tmp_path):
    """A forked child shares the parent's epoll set: if it closed the parent's pooled connections
    (or loop) on its way out, the parent's next response would never arrive (a 30 s stall)."""
    import gc

    ds = plan_dataset(3, 10_000, prefix="f", seed=5, shard_bytes=None).upload(lab_bucket)
    source = GCSSource(lab_bucket.name, "f/files/")
    names = sorted(ds.sizes)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    assert cache.read(source, names[0]) == ds.content(names[0])  # the loop and its connection pool exist
    pid = os.fork()
    if pid == 0:  # the child: reads on a loop of its own, collects what it inherited, exits
        try:
            ok = cache.read(source, names[1]) == ds.content(names[1])
            gc.collect()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    gc.collect()
    t0 = time.monotonic()
    assert cache.read(source, names[2]) == ds.content(names[2])
    assert time.monotonic() - t0 < 5, "the parent's pooled connection still answers"
    assert set(lab.downloads(lab_bucket.name).values()) == {1}


def test_a_listed_generation_fills_even_after_an_overwrite_in_a_versioned_bucket(lab_env, lab_bucket, tmp_path):
    """Downloads ask for the live object on condition that it is still the listed generation
    (cheap for any server); when it is not, the listed generation by number: in a versioned
    bucket the old bytes are still there, and they are the ones the listing promised."""
    lab_bucket.versioning_enabled = True
    lab_bucket.patch()
    for i in range(3):
        lab_bucket.blob(f"v/{i}.bin").upload_from_string(b"first %d" % i * 1000)
    source = GCSSource(lab_bucket.name, "v")
    listed = sorted(source.list(), key=lambda e: e.name)
    for i in range(3):
        lab_bucket.blob(f"v/{i}.bin").upload_from_string(b"second")
    cache = Cache(tmp_path / "c")
    assert cache.read(source, listed[0]) == b"first 0" * 1000, "one read: the listed generation's bytes"
    filled = {f.name: f for f in cache.fill_many(source, listed[1:])}
    assert all(f.error is None and f.fetched == f.size for f in filled.values()), filled
    assert [cache.read(source, e) for e in listed] == [b"first %d" % i * 1000 for i in range(3)]
    assert cache.read(source, "0.bin") == b"second", "by name: the current generation"


class _CountingFolder(LocalSource):
    """A real folder that records every fetch (in one process: the fills here run on threads)."""

    def __init__(self, root, fetched: list) -> None:
        super().__init__(root)
        self.fetched = fetched

    def fetch(self, entry, out, start=0, timeout=None):
        self.fetched.append(entry.name)
        return super().fetch(entry, out, start, timeout)


def test_a_fill_ahead_from_a_folder_that_waited_on_another_fill_does_nothing_after_it(tmp_path):
    """As on the download loop: a fill ahead of a reader that had to wait for someone else's fill of
    the same object (in practice the reader's own) does nothing once that is over, even if the object
    is not there (evicted again under a budget, or that fill failed): it was for a read that happened,
    and downloading again would only evict what is still to be read."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "x.bin").write_bytes(b"x" * 1000)
    fetched: list[str] = []
    source = _CountingFolder(root, fetched)
    cache = Cache(tmp_path / "c")
    entry = source.stat("x.bin")
    with cache._locks.hold(cache.key(source, entry)):  # another fill of x.bin, which leaves nothing
        [ahead] = cache.fill_later(source, [entry])
        time.sleep(0.3)
        assert not ahead.done(), "the fill ahead waits for the other fill"
    assert ahead.result(timeout=10) == []
    assert fetched == [] and cache.entries() == [], "the fill ahead that waited downloaded nothing"
    [again] = cache.fill_later(source, [entry])
    assert again.result(timeout=10) == [] and fetched == ["x.bin"], "one that did not wait fills"
    assert cache.read(source, entry) == b"x" * 1000 and fetched == ["x.bin"]


class _CutFolder(LocalSource):
    """A real folder whose reads fail after ``cut`` bytes ``cuts`` times (``error`` each), then run whole."""

    def __init__(self, root, cut: int, cuts: int, error: Exception) -> None:
        super().__init__(root)
        self.cut, self.cuts, self.error, self.starts = cut, cuts, error, []

    def fetch(self, entry, out, start=0, timeout=None):
        self.starts.append(start)
        if self.cuts:
            self.cuts -= 1
            with open(self.root / entry.name, "rb") as f:
                f.seek(start)
                out.write(f.read(self.cut))
            raise self.error
        return super().fetch(entry, out, start, timeout)


def test_a_fill_from_a_folder_resumes_after_a_blip_and_fails_at_once_on_anything_else(tmp_path):
    """The first attempt of a fill from a folder runs before any retry policy is built (its cost was most of a
    small file's fill); a blip still resumes from the bytes received, after the usual pause, and anything else
    fails the read at once with nothing cached."""
    (tmp_path / "data").mkdir()
    data = random.Random(3).randbytes(100_000)
    (tmp_path / "data" / "x.bin").write_bytes(data)
    blips = _CutFolder(tmp_path / "data", 30_000, 2, ConnectionResetError(104, "Connection reset by peer"))
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    t0 = time.perf_counter()
    assert cache.read(blips, "x.bin") == data
    assert blips.starts == [0, 30_000, 60_000] and cache.stats().retries == 2
    assert time.perf_counter() - t0 >= 0.1, "a blip is retried after a pause, not at once"
    broken = _CutFolder(tmp_path / "data", 30_000, 1, ValueError("not a blip"))
    other = Cache(tmp_path / "c2", min_free_bytes=0)
    with pytest.raises(ValueError, match="not a blip"):
        other.read(broken, "x.bin")
    assert broken.starts == [0] and other.stats().retries == 0 and other.entries() == []


def test_a_read_that_fills_its_copy_asks_the_index_for_no_checksum(tmp_path, monkeypatch):
    """A miss checks the copy it filled against the CRC32C its own fill computed: no query of the index for it
    (one per file was ~40 us of epoch 1's fill); a hit asks the index, once."""
    files = _write_folder(tmp_path / "data", 20, seed=4)
    source = LocalSource(tmp_path / "data")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    asked = []
    real = cache._index.stored_crc
    monkeypatch.setattr(cache._index, "stored_crc", lambda key, wait=True: (asked.append(key), real(key, wait))[1])
    for e in source.list():
        assert cache.read(source, e) == files[e.name]
    assert asked == [], f"{len(asked)} checksum queries for 20 fills"
    cache._index.flush()  # the fills' rows written (a batch the index writer had not written yet is waited for)
    for e in source.list():
        assert cache.read(source, e) == files[e.name]
    assert len(asked) == 20, "a hit checks against the index's checksum"


def test_fills_ahead_of_a_warm_epoch_cost_a_look_each_in_the_callers_thread(lab, lab_env, lab_bucket, tmp_path,
                                                                          monkeypatch):
    """In a warm epoch every fill ahead finds its copy: that look is made where the fills are asked for, so the
    reader's process hands nothing to the download loop or to a thread (that hand-over cost the main process of
    a warm decode-once epoch 59 us a sample here, beside 99 for all the rest); a copy that is missing still goes."""
    from dataferry import aio

    plan_dataset(40, 5_000, prefix="w", seed=5, shard_bytes=None).upload(lab_bucket)
    files = _write_folder(tmp_path / "data", 30, seed=6)
    bucket, folder = GCSSource(lab_bucket.name, "w/files/"), LocalSource(tmp_path / "data")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    for source in (bucket, folder):
        stage(source, cache, progress=False)
    handed, real_submit = [], aio.submit
    monkeypatch.setattr(aio, "submit", lambda coro: (handed.append("loop"), real_submit(coro))[1])
    for source, threads in ((bucket, 256), (folder, 32)):
        entries = list(source.list())
        futures = cache.fill_later(source, entries, threads=threads)
        assert futures and all(f.done() and f.result() == [] for f in futures)
    assert handed == [] and cache._ahead._pool is None, "nothing handed to the loop or to fill threads"
    gone = list(folder.list())[3]
    cache._index.discard(cache.key(folder, gone))
    (wait_for,) = cache.fill_later(folder, list(folder.list()), threads=32)
    assert cache._ahead._pool is not None, "the missing copy goes to a fill thread"
    assert wait_for.result() == [] and cache.stats().misses == 30 + 40 + 1
    assert cache.read(folder, gone) == files[gone.name] and cache.stats().misses == 30 + 40 + 1, "filled ahead"


def _write_folder(root, n: int, seed: int, low: int = 5_000, high: int = 60_000) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"{i % 7}/{i:04d}.bin": rng.randbytes(rng.randint(low, high)) for i in range(n)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def _parts(root) -> list:
    return [p for p in root.rglob("*.part")]


def test_a_reader_filling_an_uncapped_cache_asks_the_index_once_per_lease_and_never_fsyncs_a_file(tmp_path, monkeypatch):
    """Epoch 1 from a folder should cost little more than reading the folder: a fill on the reader's
    thread takes its room from the process's lease (no round trip to the index per file), renames its
    file into place at once, and the index writer makes a group of them durable with one syncfs before
    it records them (no fsync per file)."""
    files = _write_folder(tmp_path / "data", 300, seed=1)
    source = LocalSource(tmp_path / "data")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    from dataferry.cache import index as index_module
    fsyncs, reserves, real_fsync, real_ask = [], [], os.fsync, index_module.IndexWriter.ask
    syncfs, real_syncfs = [], index_module.syncfs
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(index_module, "syncfs", lambda folder: (syncfs.append(folder), real_syncfs(folder))[1])
    from dataferry.cache.requests import Reserve
    monkeypatch.setattr(index_module.IndexWriter, "ask",
                        lambda self, request, answer: (reserves.append(request) if isinstance(request, Reserve) else None,
                                                       real_ask(self, request, answer))[1])
    for e in source.list():
        assert cache.read(source, e) == files[e.name]
    assert fsyncs == [], f"{len(fsyncs)} fsyncs for {len(files)} fills"
    assert len(reserves) <= 2, f"{len(reserves)} reservations asked of the index for {len(files)} fills"
    assert cache.usage() == (300, sum(map(len, files.values())))
    assert 1 <= len(syncfs) < 300, f"{len(syncfs)} syncfs: made durable in groups before they were recorded"
    assert cache.verify().ok and _parts(tmp_path / "c") == []
    reopened = Cache(tmp_path / "c")
    assert reopened.usage() == (300, sum(map(len, files.values()))), "nothing is an orphan to the next process"


def test_one_reader_filling_file_after_file_makes_them_durable_in_groups_not_one_syncfs_each(tmp_path, monkeypatch):
    """A DataLoader worker fills one file per sample, decoding in between (a pause here): the index writer gathers
    the fills that come within GATHER_S into one syncfs and one transaction (it made one per file, a syncfs of the
    whole disk per sample of epoch 1), every one of them recorded; a flush does not wait for the gathering."""
    files = _write_folder(tmp_path / "data", 200, seed=6, low=2_000, high=8_000)
    source = LocalSource(tmp_path / "data")
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    from dataferry.cache import index as index_module
    syncfs, real_syncfs = [], index_module.syncfs
    monkeypatch.setattr(index_module, "syncfs", lambda folder: (syncfs.append(folder), real_syncfs(folder))[1])
    monkeypatch.setattr(index_module, "GATHER_S", 1.0)
    for e in source.list():
        assert cache.read(source, e) == files[e.name]
        time.sleep(0.002)  # the sample's decoding
    t0 = time.monotonic()
    cache._index.flush()
    assert time.monotonic() - t0 < 0.5, "a flush ends the writer's wait for more fills"
    assert len(syncfs) <= len(files) // 4, f"{len(syncfs)} syncfs for {len(files)} fills one after another"
    assert Cache(tmp_path / "c").usage() == (200, sum(map(len, files.values())))


def test_the_index_writer_waits_for_more_fills_only_while_no_one_waits_on_it():
    """The writer's gathering rule: a batch of placed fills or of uses (a DataLoader worker under a budget demotes
    every sample it reads) may wait for more; one holding a request someone waits for, a stop, or a fill marked ready
    (whose lock is already let go, so another process may wait for its row) may not; nor one with neither."""
    from concurrent.futures import Future

    from dataferry.cache.index import _unhurried
    from dataferry.cache.requests import Flush, Forget, Placed, Queued, Ready, Reserve, Stop, Touch
    placed, touch = Queued(Placed(None, "", "", None), None, None), Queued(Touch({}), None, None)
    assert _unhurried([placed, touch]) and _unhurried([touch]) and _unhurried([placed])
    assert not _unhurried([Queued(Forget("", 0), None, None)]), "nothing to gather"
    assert _unhurried([touch], something_to_gather=False)
    for other in [Queued(Reserve(None), Future(), None), Queued(Flush(), Future(), None), Queued(Stop(), None, None),
                  Queued(Ready("", 0.0, ""), None, None)]:
        assert not _unhurried([placed, other]) and not _unhurried([touch, other]), other[0]


def test_readers_killed_mid_epoch_leave_whole_entries_and_no_room_held(tmp_path):
    """A reader killed at any point of a fill leaves, once the cache opens again, only entries that
    verify, no temp file, and no room held for it (its lease is reclaimed)."""
    import signal
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    files = _write_folder(tmp_path / "data", 400, seed=2, high=120_000)
    source = LocalSource(tmp_path / "data")
    root = tmp_path / "c"
    script = Path(__file__).parent / "scripts" / "read_folder.py"
    rng = random.Random(5)
    for kill in range(4):
        p = subprocess.Popen([sys.executable, str(script), str(tmp_path / "data"), str(root), "3"])
        time.sleep(rng.uniform(1.0, 2.5))  # past the imports, in an epoch
        p.send_signal(signal.SIGKILL)
        p.wait()
        cache = Cache(root)
        assert cache.verify().ok, f"a bad entry after kill {kill}"
        assert _parts(root) == [], "temp files of the dead process are cleaned at open"
        db = sqlite3.connect(root / "index.sqlite")
        assert db.execute("SELECT count(*) FROM entries WHERE state != 'ready'").fetchone()[0] == 0, \
            "the dead reader's reservations are gone"
        rows = db.execute("SELECT count(*), coalesce(sum(size), 0) FROM entries").fetchone()
        db.close()
        assert cache.usage() == tuple(rows)
        for r in cache.entries():
            assert cache.read(source, r["name"]) == files[r["name"]]


def test_fills_of_a_dataloader_worker_that_exits_stay_in_the_cache(tmp_path):
    """A multiprocessing child (a DataLoader worker) ends without running atexit: what it filled is
    still recorded, not removed as orphans by the next open."""
    import multiprocessing

    files = _write_folder(tmp_path / "data", 120, seed=3)
    source = LocalSource(tmp_path / "data")
    cache = Cache(tmp_path / "c", min_free_bytes=0)

    child = multiprocessing.get_context("fork").Process(target=_read_every_file, args=(cache, source))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    reopened = Cache(tmp_path / "c")
    assert reopened.usage() == (120, sum(map(len, files.values())))
    for e in source.list():
        assert reopened.read(source, e) == files[e.name]
    assert reopened.stats().misses == 0 and reopened.verify().ok


def _read_every_file(cache, source) -> None:
    for e in source.list():
        cache.read(source, e)


def test_a_read_that_fills_a_small_object_is_handed_the_bytes_its_fill_checked(tmp_path, monkeypatch):
    """Epoch 1 from a folder: a read that misses fills the copy and is handed the bytes the fill checked as they
    came, not the copy read back (one open, read and CRC32C less a file). The copy is whole on disk with its row
    and checksum, and the next read reads it back and checks it. An object too big to hold in memory (over
    ``HELD_MAX``) is written as it comes and read back, as before."""
    import dataferry.cache.reads as core
    from dataferry.cache.checksum import b64
    from dataferry.cache.sides import HELD_MAX

    files = _write_folder(tmp_path / "data", 12, seed=8)
    files["big.bin"] = os.urandom(HELD_MAX + 12_345)
    (tmp_path / "data" / "big.bin").write_bytes(files["big.bin"])
    folder, cache = LocalSource(tmp_path / "data"), Cache(tmp_path / "c", min_free_bytes=0)
    read_back, real = [], core._read_all
    monkeypatch.setattr(core, "_read_all", lambda fd, size: (read_back.append(size), real(fd, size))[1])
    for name, data in files.items():
        if name == "big.bin":
            continue
        got = cache.read_verified(folder, name)
        assert type(got) is bytes and got == data
    assert read_back == [], "a read that filled its copy did not read it back"
    assert cache.stats().misses == 12 and cache.stats().hits == 0
    rows = {row["name"]: row for row in cache.entries()}
    for name, data in files.items():
        if name != "big.bin":
            assert rows[name]["state"] == "ready" and rows[name]["crc32c"] == b64(google_crc32c.value(data))
            assert cache.path(folder, name).read_bytes() == data
    read_back.clear()
    assert all(cache.read_verified(folder, name) == data for name, data in files.items() if name != "big.bin")
    assert len(read_back) == 12 and cache.stats().hits >= 12, "later reads read the copy back, and check it"
    read_back.clear()
    assert cache.read_verified(folder, "big.bin") == files["big.bin"] and read_back == [len(files["big.bin"])]


def test_placed_fills_wake_the_index_writer_once_a_gathering_and_an_answer_at_once(tmp_path, monkeypatch):
    """Fills on the lease are made durable and recorded together: while the index writer gathers them (one
    ``syncfs`` for all), a placed fill does not wake it (a wake-up each made the filling thread wait for the
    GIL at every fill and doubled a small file's fill CPU here); a request someone waits for still ends the
    gathering at once."""
    from dataferry.cache import index as index_module

    files = _write_folder(tmp_path / "data", 40, seed=9)
    folder, cache = LocalSource(tmp_path / "data"), Cache(tmp_path / "c", min_free_bytes=0)
    cache.read(folder, next(iter(files)))  # the lease is taken, the writer is running
    cache._index.flush()
    monkeypatch.setattr(index_module, "GATHER_S", 1.0)
    writer = cache._index.writer
    takes, real_drained = [], writer._drained
    monkeypatch.setattr(writer, "_drained", lambda most: (takes.append(most), real_drained(most))[1])
    syncs, real_syncfs = [], index_module.syncfs
    monkeypatch.setattr(index_module, "syncfs", lambda folder: (syncs.append(folder), real_syncfs(folder))[1])
    t0 = time.monotonic()
    for name in list(files)[1:]:
        assert cache.read(folder, name) == files[name]
    cache._index.flush()
    assert time.monotonic() - t0 < 0.8, "the flush, which waits for an answer, ended the gathering"
    assert 1 <= len(syncs) <= 3, "one syncfs for the fills of a gathering (the lease, growing, may end one)"
    assert len(takes) <= 8, f"the writer took up the queue {len(takes)} times for 39 fills: woken by each"
    assert {row["state"] for row in cache.entries()} == {"ready"} and len(cache.entries()) == 40


def test_a_folders_small_file_is_copied_with_one_read_and_every_byte_of_a_large_one(tmp_path, monkeypatch):
    """``LocalSource.fetch`` asks for one byte past the listed end, so a small file costs one read (its end is
    the short read); a file of several chunks comes whole, from any offset; one that grew since it was listed is
    refused, never copied in part."""
    import io

    from dataferry.sources import ChangedAtSource

    small, large = os.urandom(40_000), os.urandom(3 * (1 << 20) + 17)
    (tmp_path / "small.bin").write_bytes(small)
    (tmp_path / "large.bin").write_bytes(large)
    folder = LocalSource(tmp_path)
    entries = {e.name: e for e in folder.list()}
    reads, real_pread = [], os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: (reads.append(n), real_pread(fd, n, at))[1])
    out = io.BytesIO()
    assert folder.fetch(entries["small.bin"], out) == len(small) and out.getvalue() == small
    assert reads == [len(small) + 1]
    for start in (0, 1000, (1 << 20) + 5):
        out = io.BytesIO()
        assert folder.fetch(entries["large.bin"], out, start=start) == len(large) - start
        assert out.getvalue() == large[start:]
    with open(tmp_path / "small.bin", "ab") as f:
        f.write(b"more")
    with pytest.raises(ChangedAtSource, match="small.bin"):
        folder.fetch(entries["small.bin"], io.BytesIO())
