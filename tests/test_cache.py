"""The cache against the lab: verified fills, budget, eviction, corruption, changes, crashes, faults."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import google_crc32c
import pytest

from dataferry import Cache, GCSSource, LocalSource, stage
from dataferry.cache import CacheFullWarning
from dataferry.course.lab import Profile, plan_dataset
from dataferry.sources import ChangedAtSource, Entry, SourceError

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def dataset(lab_env, lab_bucket):
    ds = plan_dataset(40, 50_000, prefix="ds", seed=11, shard_bytes=None).upload(lab_bucket)
    return ds, GCSSource(lab_bucket.name, "ds/files/")


def test_read_fills_once_then_hits_byte_exact(lab, dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    entries = list(source.list())
    assert len(entries) == 40 and all(e.crc32c for e in entries)
    for e in entries:
        assert cache.read(source, e) == ds.content(e.name)
    for e in entries:
        assert cache.read(source, e) == ds.content(e.name)
    s = cache.stats()
    assert (s.misses, s.hits, s.bytes_from_source) == (40, 40, 40 * 50_000)
    assert set(lab.downloads(source.bucket).values()) == {1}, "each object downloaded exactly once"
    assert cache.usage() == (40, 40 * 50_000)


def test_reopened_cache_reuses_every_entry(dataset, tmp_path):
    ds, source = dataset
    stage(source, Cache(tmp_path / "c"), progress=False)
    again = Cache(tmp_path / "c")
    assert stage(source, again, progress=False).fetched == 0
    assert again.read(source, next(iter(source.list()))) and again.stats().misses == 0


def test_overwritten_object_is_never_served_stale(lab, dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    name = ds.object_names[0].removeprefix("ds/files/")
    assert cache.read(source, name) == ds.content(name)
    lab.client().bucket(source.bucket).blob("ds/files/" + name).upload_from_string(b"version two")
    assert cache.read(source, name) == b"version two"  # by name: the current version
    assert cache.read(source, name) == b"version two"


def test_an_object_rewritten_with_the_same_size_is_never_served_stale(lab, dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    name = ds.object_names[2].removeprefix("ds/files/")
    assert cache.read(source, name) == ds.content(name)
    same_size = bytes(b ^ 0xFF for b in ds.content(name))
    lab.client().bucket(source.bucket).blob("ds/files/" + name).upload_from_string(same_size)
    assert cache.read(source, name) == same_size, "a new generation, whatever its size"


def test_reading_a_listed_version_that_is_gone_says_so(lab, dataset, tmp_path):
    ds, source = dataset
    old = source.stat(ds.object_names[1].removeprefix("ds/files/"))
    lab.client().bucket(source.bucket).blob("ds/files/" + old.name).upload_from_string(b"new")
    with pytest.raises(ChangedAtSource, match="is gone: the object changed or was deleted since it was listed"):
        Cache(tmp_path / "c").read(source, old)
    assert Cache(tmp_path / "c").usage() == (0, 0), "nothing half-written"


def test_corrupted_file_is_flagged_by_verify_and_refetched(lab, dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    stage(source, cache, progress=False)
    victim = cache.entries()[0]
    path = next(p for p in (tmp_path / "c" / "objects").rglob("*")
                if p.is_file() and p.name == Cache.key(source, Entry(victim["name"], 0, victim["version"])))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # a flipped bit, same size
    path.write_bytes(bytes(data))
    report = cache.verify()
    assert [(name, why.split()[0]) for _, name, why in report.bad] == [(victim["name"], "crc32c")]
    assert report.checked == 40
    before = lab.downloads(source.bucket)["ds/files/" + victim["name"]]
    assert cache.read(source, victim["name"]) == ds.content(victim["name"])
    assert lab.downloads(source.bucket)["ds/files/" + victim["name"]] == before + 1
    assert cache.verify().ok


def test_truncated_file_is_refetched_on_read_without_verify(dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    e = next(iter(source.list()))
    cache.read(source, e)
    path = cache.path(source, e)
    path.write_bytes(path.read_bytes()[:10])
    assert cache.read(source, e) == ds.content(e.name)
    assert cache.stats().refetches == 1


def test_budget_holds_and_lru_evicts(dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c", max_bytes=400_000)  # room for 8 of 40 objects
    entries = sorted(source.list(), key=lambda e: e.name)
    for e in entries:
        assert cache.read(source, e) == ds.content(e.name)
        assert cache.usage()[1] <= 400_000
    assert cache.stats().evictions == 32
    assert {r["name"] for r in cache.entries()} == {e.name for e in entries[-8:]}, "the 8 most recent stay"


def _eight_of_forty_cached(dataset, tmp_path):
    """A cache with room for 8 of the 40 objects, holding the first 8 by name."""
    _, source = dataset
    cache = Cache(tmp_path / "c", max_bytes=400_000)
    entries = sorted(source.list(), key=lambda e: e.name)
    for e in entries[:8]:
        cache.read(source, e)
    return source, cache, entries


def test_demoted_entries_go_first_most_recently_demoted_first(dataset, tmp_path):
    source, cache, entries = _eight_of_forty_cached(dataset, tmp_path)
    cache.demote(source, entries[:2])  # used up for this epoch: 0 and 1
    cache.demote(source, [entries[5]])  # and then 5
    cache.read(source, entries[8])
    assert not cache.contains(source, entries[5]), "the most recently demoted goes first"
    cache.read(source, entries[9])
    cache.read(source, entries[10])
    assert not any(cache.contains(source, e) for e in entries[:2])
    assert all(cache.contains(source, e) for e in entries[2:5] + entries[6:11]), "no entry in use was evicted"
    cache.read(source, entries[1])  # read again: in use, no longer demoted
    assert cache.contains(source, entries[1]) and cache.stats().evictions == 4


def test_entries_to_be_read_stay_soonest_first_after_the_used_up(dataset, tmp_path):
    source, cache, entries = _eight_of_forty_cached(dataset, tmp_path)
    cache.demote(source, entries[:8])  # an epoch ends: all used up
    cache.will_read(source, [entries[3], entries[5], entries[0], entries[30]])  # the next epoch's order
    for e in entries[10:16]:  # room for six new: the five used up, then the one read last of those kept
        cache.read(source, e)
    assert [cache.contains(source, e) for e in (entries[3], entries[5], entries[0])] == [True, True, False]
    cache.read(source, entries[16])
    assert cache.contains(source, entries[3]) and not cache.contains(source, entries[5]), "soonest read stays longest"


def test_read_refetches_a_flipped_byte_of_the_same_size(lab, dataset, tmp_path):
    """Every call that hands bytes (or a file) to a user checks them against the object's CRC32C: a same-size
    damaged copy is dropped and fetched again, never returned (read_verified is read, by its old name)."""
    ds, source = dataset
    cache = Cache(tmp_path / "c")
    e = next(iter(source.list()))
    cache.read(source, e)

    def damage():
        path = cache.path(source, e)
        data = bytearray(path.read_bytes())
        data[7] ^= 0x01
        path.write_bytes(bytes(data))

    damage()
    assert cache.read(source, e) == ds.content(e.name)
    assert cache.stats().refetches == 1 and lab.downloads(source.bucket)[source.prefix + e.name] == 2
    assert cache.read_verified(source, e) == ds.content(e.name) and cache.stats().refetches == 1
    damage()
    with cache.open(source, e) as f:
        assert f.read() == ds.content(e.name)
    damage()
    assert cache.path(source, e).read_bytes() == ds.content(e.name)
    assert cache.stats().refetches == 3


def test_a_copy_whose_checksum_is_not_recorded_yet_is_never_returned_unchecked(tmp_path):
    """A file in place with no CRC32C in the index (another worker's fill, its row not yet written; or one a
    crash left): a folder's object has no CRC32C of its own, so the copy is filled again rather than trusted."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "x.bin").write_bytes(b"right bytes " * 100)
    source = LocalSource(root)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    entry = source.stat("x.bin")
    path = Path(cache._layout.object_path(cache.key(source, entry)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"WRONG bytes " * 100)  # the right size, no row naming it
    assert cache.read(source, entry) == b"right bytes " * 100
    path.unlink()
    path.write_bytes(b"WRONG bytes " * 100)
    assert cache.read_verified(source, entry) == b"right bytes " * 100


def test_entry_held_open_survives_eviction(dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c", max_bytes=200_000)
    entries = sorted(source.list(), key=lambda e: e.name)
    held = cache.open(source, entries[0])
    for e in entries[1:]:
        cache.read(source, e)
    assert cache.contains(source, entries[0]), "an open reader keeps its entry"
    assert held.read() == ds.content(entries[0].name)
    held.close()
    for e in entries[1:5]:
        cache.read(source, e)
    assert not cache.contains(source, entries[0]), "once closed it can be evicted"


def test_object_larger_than_budget_streams_with_warning(dataset, tmp_path):
    ds, source = dataset
    cache = Cache(tmp_path / "c", max_bytes=10_000)
    e = next(iter(source.list()))
    with pytest.warns(CacheFullWarning, match="does not fit in the cache"):
        assert cache.read(source, e) == ds.content(e.name)
    assert cache.usage() == (0, 0) and cache.stats().streamed == 1


def test_full_disk_streams_instead_of_filling(dataset, tmp_path):
    ds, source = dataset
    import shutil

    cache = Cache(tmp_path / "c", min_free_bytes=shutil.disk_usage(tmp_path).free + 10**9)
    e = next(iter(source.list()))
    with pytest.warns(CacheFullWarning):
        assert cache.read(source, e) == ds.content(e.name)
    assert list((tmp_path / "c").rglob("*.part")) == [], "no temp file left behind"
    assert cache.usage() == (0, 0)


def test_eight_processes_fetch_each_object_exactly_once(lab, lab_env, lab_bucket, tmp_path):
    lab.set_profile(Profile("test-latency", 20, None))  # so that the processes really overlap
    ds = plan_dataset(200, 20_000, prefix="p", seed=5, shard_bytes=None).upload(lab_bucket)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, SCRIPTS / "read_all.py", lab_bucket.name, "p/files/",
                               str(tmp_path / "cache"), str(go), str(tmp_path / f"out{i}")])
             for i in range(8)]
    time.sleep(2)
    go.touch()
    assert [p.wait(timeout=300) for p in procs] == [0] * 8
    expected = {k: google_crc32c.value(ds.content(k)) for k in ds.sizes}
    for i in range(8):
        got = dict(line.split() for line in (tmp_path / f"out{i}").read_text().splitlines())
        assert {k: int(v) for k, v in got.items()} == expected
    counts = lab.downloads(lab_bucket.name)
    assert len(counts) == 200 and set(counts.values()) == {1}


def test_sigkilled_staging_leaves_nothing_bad_and_restaging_fetches_only_the_rest(lab, lab_env, lab_bucket, tmp_path):
    lab.set_profile(Profile("test-kill", 10, 40))
    sizes = [20_000] * 30 + [400_000] * 10  # small and large, so kills land mid-file too
    ds = plan_dataset(len(sizes), 1, prefix="k", seed=8, shard_bytes=None)
    ds.sizes = dict(zip(ds.sizes, sizes))
    ds.upload(lab_bucket)
    root = tmp_path / "cache"
    rng = random.Random(1234)
    kills = 0
    while kills < 20:
        p = subprocess.Popen([sys.executable, SCRIPTS / "stage_into.py", lab_bucket.name, "k/files/", str(root), "4"])
        time.sleep(rng.uniform(0.3, 1.5))  # past the imports, somewhere in the staging
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
        cache = Cache(root)
        assert cache.verify().ok, f"a bad entry after kill {kills}"
        assert list(root.rglob("*.part")) == [], "temp files of the dead process are cleaned at open"
        if len(cache.entries()) == len(sizes):  # it finished: start over so every kill interrupts work
            cache.clear()
    cache = Cache(root)
    have = {r["name"] for r in cache.entries()}
    before = lab.downloads(lab_bucket.name)
    report = stage(GCSSource(lab_bucket.name, "k/files/"), cache, progress=False)
    assert report.fetched == len(sizes) - len(have) and not report.failures
    after = lab.downloads(lab_bucket.name)
    newly = {n.removeprefix("k/files/") for n in after if after[n] > before.get(n, 0)}
    assert newly == set(ds.sizes) - have, "only the missing objects were downloaded"
    for key in ds.sizes:
        assert cache.read(GCSSource(lab_bucket.name, "k/files/"), key) == ds.content(key)


def test_connection_resets_are_retried_resumed_and_bytes_stay_right(lab, lab_env, lab_bucket, tmp_path):
    ds = plan_dataset(24, 2_000_000, prefix="r", seed=3, shard_bytes=None).upload(lab_bucket)
    source = GCSSource(lab_bucket.name, "r/files/")
    entries = list(source.list())  # listed before the faults: this is about the downloads
    # Half of all connections are reset as they open, and every connection is cut after 1.5 MB,
    # so every download stops mid-object, however connections are reused, and must resume.
    faults = [{"name": "resets", "type": "reset_peer", "stream": "downstream", "toxicity": 0.5,
               "attributes": {"timeout": 0}},
              {"name": "cuts", "type": "limit_data", "stream": "downstream", "toxicity": 1.0,
               "attributes": {"bytes": 1_500_000}}]
    for toxic in faults:
        lab.toxiproxy.add_toxic("gcs", toxic)
    try:
        cache = Cache(tmp_path / "c", retry_deadline_s=60)
        report = stage(source, cache, entries, in_flight=4, progress=False)
    finally:
        for toxic in faults:
            lab.toxiproxy.remove_toxic("gcs", toxic["name"])
    assert report.failures == [] and report.fetched == 24
    assert cache.stats().retries > 0
    assert any(status == 206 for _, _, status in lab.requests()), "cut downloads resumed with a Range"
    for e in entries:
        assert cache.read(source, e) == ds.content(e.name)
    assert cache.verify().ok


def test_source_that_stays_down_fails_clearly_within_the_deadline(lab, lab_env, dataset, tmp_path):
    ds, source = dataset
    e = next(iter(source.list()))
    cache = Cache(tmp_path / "c", retry_deadline_s=3)
    lab.toxiproxy.add_toxic("gcs", {"name": "down", "type": "reset_peer", "toxicity": 1.0, "attributes": {"timeout": 0}})
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"kept failing for \d+ s \(\d+ attempts; .*nothing was cached"):
            cache.read(source, e)
        assert time.monotonic() - t0 < 15
    finally:
        lab.toxiproxy.remove_toxic("gcs", "down")
    assert cache.usage() == (0, 0)
    assert list((tmp_path / "c").rglob("*.part")) == []
    assert cache.read(source, e) == ds.content(e.name), "and works again once the source is back"


def test_checksum_mismatch_is_refetched_then_named(dataset, tmp_path):
    ds, source = dataset
    good = next(iter(source.list()))
    lying = Entry(good.name, good.size, good.version, "AAAAAA==")  # a checksum the bytes never match
    cache = Cache(tmp_path / "c", max_refetches=2)
    with pytest.raises(SourceError, match=rf"{good.name}: crc32c .* expected AAAAAA== after 3 downloads"):
        cache.read(source, lying)
    assert cache.stats().refetches == 2 and cache.usage() == (0, 0)


HOSTILE = ["../../escape.bin", "/etc/passwd-like", "a/../../../up.bin", "ctl\x01\x1f\x7fname",
           "x" * 1000 + ".bin", "données/日本語/ファイル.bin", "./dot", "spaces and\ttabs", "nul\0name"]


def _tree(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def test_hostile_object_names_stay_inside_the_cache(lab, lab_env, lab_bucket, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    bucket = lab.client().bucket(lab_bucket.name)
    for i, name in enumerate(HOSTILE):
        bucket.blob(name).upload_from_string(f"payload {i}".encode())
    source = GCSSource(lab_bucket.name)
    listed = {e.name for e in source.list()}
    assert listed == set(HOSTILE)
    outside = _tree(tmp_path) - _tree(work)
    cache = Cache(work / "cache")
    report = stage(source, cache, progress=False)
    assert report.failures == [] and report.fetched == len(HOSTILE)
    for i, name in enumerate(HOSTILE):
        assert cache.read(source, name) == f"payload {i}".encode()
    assert _tree(tmp_path) - _tree(work) == outside, "nothing was created outside the cache"
    for p in (work / "cache").rglob("*"):
        assert os.path.realpath(p).startswith(str(work / "cache"))


def test_hostile_names_in_a_local_source(tmp_path):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    (root / "ctl\x01name").write_bytes(b"one")
    (root / "sub" / "日本語.bin").write_bytes(b"two")
    (root / ("y" * 255)).write_bytes(b"three")
    (root / "link").symlink_to(secret)
    source = LocalSource(root, follow_links=False)  # a folder not trusted: links neither listed nor read
    cache = Cache(tmp_path / "cache")
    assert cache.read(source, "ctl\x01name") == b"one"
    assert cache.read(source, "sub/日本語.bin") == b"two"
    assert cache.read(source, "y" * 255) == b"three"
    assert {e.name for e in source.list()} == {"ctl\x01name", "sub/日本語.bin", "y" * 255}, "symlinks are not listed"
    for bad in ["../secret.txt", "/etc/passwd", "sub/../../secret.txt", "a\0b", "link", "", "x" * 1024]:
        with pytest.raises((ValueError, OSError)):
            cache.read(source, bad)
    assert secret.read_text() == "outside"


def test_local_source_change_is_a_new_version(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "f.bin").write_bytes(b"one")
    source, cache = LocalSource(root), Cache(tmp_path / "cache")
    assert cache.read(source, "f.bin") == b"one"
    time.sleep(0.01)
    (root / "f.bin").write_bytes(b"two!")
    assert cache.read(source, "f.bin") == b"two!"


def test_missing_bucket_and_folder_are_clear(lab_env, tmp_path):
    from dataferry.sources import NotFoundAtSource

    with pytest.raises(NotFoundAtSource, match="bucket gs://no-such-bucket does not exist"):
        list(GCSSource("no-such-bucket").list())
    with pytest.raises(NotFoundAtSource, match="is not a folder"):
        list(LocalSource(tmp_path / "nope").list())
    with pytest.raises(ValueError, match="give the bare name"):
        GCSSource("gs://bucket/prefix")


def test_a_cache_no_longer_referenced_is_freed_at_once_with_its_parts(tmp_path):
    """No reference cycle keeps a dropped Cache (and its index connection, its lock file, its place among the caches
    renewed after every fork) alive until a garbage collection."""
    import gc
    import weakref

    cache = Cache(tmp_path / "c")
    cache.usage()
    gone = weakref.ref(cache)
    gc.disable()
    try:
        del cache
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("call", ["read", "open"])
def test_the_warning_that_an_object_does_not_fit_points_at_the_callers_line(tmp_path, call):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(b"x" * 5000)
    source, cache = LocalSource(tmp_path / "src"), Cache(tmp_path / "c", max_bytes=1000, min_free_bytes=0)
    with pytest.warns(CacheFullWarning, match="does not fit in the cache") as caught:
        got = getattr(cache, call)(source, "big.bin")
        assert (got if call == "read" else got.read()) == b"x" * 5000
    assert caught[0].filename == __file__, (caught[0].filename, caught[0].lineno)


def test_a_disk_that_returns_damaged_bytes_is_a_local_disk_error_and_never_served(tmp_path, monkeypatch):
    """A disk that reads back other bytes than were written (it cannot be made to fail here, so the
    cache's one read of a cached file, ``reads._read_all``, flips a byte as such a disk would): a verified read
    of a cached copy checks it, and the copies it fills again after a damaged one (a read that fills a copy is
    handed the bytes its fill checked, so the copy is cached first here), never returns the damaged bytes, and after its refetches says
    the local disk is at fault: a ``DamagedOnDisk``, an ``OSError`` like every cache-folder error, not a
    ``SourceError``. Bytes damaged in every download stay a ``DamagedAtSource``, a ``SourceError``."""
    import dataferry.cache.reads as core
    from dataferry.cache import ChecksumError, DamagedAtSource, DamagedOnDisk

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"good bytes " * 1000)
    source = LocalSource(tmp_path / "src")
    cache = Cache(tmp_path / "c")
    real = core._read_all
    cache.fill(source, "a.bin")

    def rotten(fd, size):
        data = bytearray(real(fd, size))
        data[3] ^= 0x01
        return bytes(data)

    monkeypatch.setattr(core, "_read_all", rotten)
    with pytest.raises(DamagedOnDisk, match="a.bin.*local disk") as e:
        cache.read_verified(source, "a.bin")
    assert isinstance(e.value, (ChecksumError, OSError)) and not isinstance(e.value, SourceError)
    assert cache.stats().refetches == cache.max_refetches + 1, "each damaged read-back dropped, none served"
    monkeypatch.setattr(core, "_read_all", real)
    assert cache.read_verified(source, "a.bin") == b"good bytes " * 1000, "a sound disk reads it again"
    assert issubclass(DamagedAtSource, SourceError) and issubclass(DamagedAtSource, ChecksumError)


def test_a_disk_that_keeps_shortening_copies_is_named_though_a_read_that_fills_is_handed_its_bytes(tmp_path,
                                                                                                    monkeypatch):
    """A copy read back the wrong size is dropped and filled again, and that copy is read back too (not handed
    over as the fill held it): a disk that keeps shortening what it stores is named, a ``DamagedOnDisk``."""
    import dataferry.cache.reads as core
    from dataferry.cache import DamagedOnDisk

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"whole " * 1000)
    source, cache = LocalSource(tmp_path / "src"), Cache(tmp_path / "c")
    cache.fill(source, "a.bin")
    real = core._read_all
    monkeypatch.setattr(core, "_read_all", lambda fd, size: real(fd, size)[:-1])
    with pytest.raises(DamagedOnDisk, match="a.bin.*wrong size"):
        cache.read_verified(source, "a.bin")
    monkeypatch.setattr(core, "_read_all", real)
    assert cache.read_verified(source, "a.bin") == b"whole " * 1000


def test_stat_keeps_to_the_sources_retry_deadline(lab, lab_env, dataset, tmp_path):
    """GCSSource.stat is retried by the source's own policy, within its retry_deadline_s (google's default retry
    ran for 120 s and ignored it), and says how it ended."""
    ds, source = dataset
    e = next(iter(source.list()))
    quick = GCSSource(source.bucket, source.prefix, retry_deadline_s=2)
    lab.toxiproxy.add_toxic("gcs", {"name": "down", "type": "reset_peer", "toxicity": 1.0, "attributes": {"timeout": 0}})
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"kept failing for \d+ s \(\d+ attempts"):
            quick.stat(e.name)
        assert time.monotonic() - t0 < 10
    finally:
        lab.toxiproxy.remove_toxic("gcs", "down")
    assert quick.stat(e.name) == e


def test_the_api_baseline_retries_and_resumes_a_read_cut_by_the_network(lab, lab_env, lab_bucket):
    """SourceDataset (a Dataset that downloads in __getitem__, the course's baseline) is retried as a user's
    google-cloud-storage read is, resuming where the cut came: it used to fail at the first reset."""
    from dataferry.dataset import SourceDataset

    ds = plan_dataset(4, 2_000_000, prefix="b", seed=5, shard_bytes=None).upload(lab_bucket)
    source = GCSSource(lab_bucket.name, "b/files/")
    entries = sorted(source.list(), key=lambda e: e.name)
    baseline = SourceDataset(source, entries)
    lab.toxiproxy.add_toxic("gcs", {"name": "cuts", "type": "limit_data", "stream": "downstream", "toxicity": 1.0,
                                    "attributes": {"bytes": 700_000}})
    try:
        got = [baseline[i] for i in range(len(entries))]
    finally:
        lab.toxiproxy.remove_toxic("gcs", "cuts")
    assert got == [ds.content(e.name) for e in entries]


@pytest.mark.parametrize("size, zeros", [(100_000, 80_000), (400_000, 131_000), (40 << 20, 20 << 20)],
                         ids=["held in memory", "written as it comes", "in many chunks"])
def test_a_copys_trailing_zeros_take_no_disk(tmp_path, size, zeros):
    """Decode-once's records are all the size of the largest picture, the rest zeros (a flower's: 262 KB of pixels
    in 393 KB): written out, every later epoch read the zeros from the disk too. A trailing run of zeros is left
    a hole: the copy reads back the same bytes, checks out, and takes the disk only its other bytes."""
    root = tmp_path / "data"
    root.mkdir()
    data = random.Random(size).randbytes(size - zeros) + bytes(zeros)
    (root / "f.bin").write_bytes(data)
    source, cache = LocalSource(root), Cache(tmp_path / "cache")
    assert cache.read(source, "f.bin") == data
    path = cache.path(source, "f.bin")
    assert path.stat().st_size == size and path.read_bytes() == data
    assert path.stat().st_blocks * 512 < size - zeros + 64 * 1024, "the zeros are a hole"
    assert cache.verify().ok
    assert cache.read(source, "f.bin") == data


def test_a_decoded_record_takes_the_disk_its_picture_takes_not_its_padding(tmp_path):
    from dataferry.course.lab.flowers import plan_flowers
    from dataferry.decode import DecodedImages, pixels

    plan_flowers(1, seed=0, prefix="").write_to(tmp_path / "photos")
    source, cache = LocalSource(tmp_path / "photos"), Cache(tmp_path / "cache")
    decoded = DecodedImages(source, cache, size=256)
    for original in source.list():
        entry = decoded.entry(original)
        image = pixels(cache.read_verified(decoded, entry))
        path = cache.path(decoded, entry)
        assert path.stat().st_size == decoded.sample_bytes > image.numel() + 64 * 1024, "a flower leaves padding"
        assert path.stat().st_blocks * 512 < image.numel() + 8192, "only the picture's bytes are on the disk"


def test_ranges_written_out_of_order_with_zeros_read_back_whole_and_a_restart_keeps_nothing(tmp_path):
    """A fill in ranges (a large object from a bucket) writes each range at its offset as it comes, in any order;
    zeros left unwritten are a hole of the file sized at the start, so no range can cut another short, and a restart
    (before a refetch) keeps none of the bytes written before it."""
    from dataferry.cache.transport import Part, Sink

    a = random.Random(1).randbytes(100_000) + bytes(100_000)  # data, then zeros to the range's end
    b = bytes(200_000)                                         # a range of zeros only
    c = random.Random(2).randbytes(200_000)
    tmp, deadline = tmp_path / "x.part", time.monotonic() + 60
    sink = Sink(str(tmp), 600_000, held=False)
    for start, data in ((400_000, c), (0, a), (200_000, b)):  # the last range first
        assert Part(sink, start, start + len(data), deadline).write(data) == len(data)
    assert tmp.read_bytes() == a + b + c
    assert tmp.stat().st_blocks * 512 < 300_000 + 64 * 1024, "the zeros are a hole"
    sink.restart()
    assert tmp.read_bytes() == bytes(600_000), "nothing of the first attempt is left"
    Part(sink, 0, 600_000, deadline).write(a + b + c)
    sink.close()
    assert tmp.read_bytes() == a + b + c
