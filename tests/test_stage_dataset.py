"""Staging (threads, ranks under torchrun), prefetch, the PyTorch Dataset in worker processes, the CLI."""

import json
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from dataferry import Cache, CachedDataset, GCSSource, LocalSource, Prefetcher, stage
from dataferry.course.lab import Profile, plan_dataset
from dataferry.staging import shard_of

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def dataset(lab_env, lab_bucket):
    ds = plan_dataset(48, 30_000, prefix="d", seed=21, shard_bytes=None).upload(lab_bucket)
    return ds, GCSSource(lab_bucket.name, "d/files/")


def test_stage_reports_and_progress(dataset, tmp_path, capsys):
    ds, source = dataset
    report = stage(source, Cache(tmp_path / "c"), in_flight=8, progress=True)
    assert (report.files, report.fetched, report.already_cached) == (48, 48, 0)
    assert report.bytes_fetched == report.bytes_total == 48 * 30_000 and report.MBps > 0
    captured = capsys.readouterr()
    assert "staged 48 files: 48 downloaded (1.4 MB), 0 already cached" in captured.out
    assert "staging gs://" in captured.err, "a tqdm progress bar was shown"
    again = stage(source, Cache(tmp_path / "c"), names=list(ds.sizes)[:5], progress=False)
    assert (again.files, again.fetched, again.already_cached) == (5, 0, 5)


def test_a_bucket_width_says_downloads_in_flight_and_workers_below_the_default_is_questioned(dataset, tmp_path):
    """``stage(source, cache, workers=32)`` reads as "32 threads" but capped a bucket at 32 downloads in flight
    (the default is 256, on one thread): it still does what it says, with a warning that names ``in_flight``.
    ``in_flight`` is the width for any source (downloads in flight on a bucket, threads on a folder)."""
    import warnings

    from dataferry.errors import BadArgument
    from dataferry.staging import BUCKET_IN_FLIGHT

    ds, source = dataset
    with pytest.warns(UserWarning, match=rf"workers=32\) caps .* at 32 downloads in flight.*default is {BUCKET_IN_FLIGHT}.*in_flight=32"):
        report = stage(source, Cache(tmp_path / "a"), workers=32, progress=False)
    assert report.fetched == 48
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stage(source, Cache(tmp_path / "b"), in_flight=4, progress=False).fetched == 48
        folder = tmp_path / "folder"
        folder.mkdir()
        (folder / "x.bin").write_bytes(b"x")
        assert stage(LocalSource(folder), Cache(tmp_path / "f"), workers=4, progress=False).fetched == 1, \
            "on a folder, workers are threads: nothing to question"
    for bad in (0, -1, 2.5, "8"):
        with pytest.raises(BadArgument, match="in_flight="):
            stage(source, Cache(tmp_path / "c"), in_flight=bad, progress=False)
    with pytest.raises(BadArgument, match="not both"):
        stage(source, Cache(tmp_path / "c"), workers=4, in_flight=4, progress=False)


def test_stage_lists_failures_without_stopping(dataset, tmp_path):
    ds, source = dataset
    report = stage(source, Cache(tmp_path / "c"), names=[*list(ds.sizes)[:3], "no/such/object"], progress=False)
    assert report.fetched == 3
    assert [n for n, _ in report.failures] == ["no/such/object"]
    assert "not found" in report.failures[0][1]
    assert "1 failures" in str(report) and "failed: no/such/object" in str(report)


def test_rank_shares_cover_everything_once(dataset, tmp_path):
    ds, source = dataset
    names = [set(), set(), set()]
    for rank in range(3):
        cache = Cache(tmp_path / f"r{rank}")
        stage(source, cache, rank=rank, world_size=3, progress=False)
        names[rank] = {r["name"] for r in cache.entries()}
        assert all(shard_of(n, 3) == rank for n in names[rank])
    assert set().union(*names) == set(ds.sizes) and sum(map(len, names)) == 48
    with pytest.raises(ValueError, match="rank must be in"):
        stage(source, Cache(tmp_path / "x"), rank=3, world_size=3)


def test_two_ranks_under_torchrun_on_gloo(dataset, tmp_path):
    ds, source = dataset
    out = tmp_path / "gathered.json"
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(SCRIPTS / "torchrun_stage.py"),
                           source.bucket, source.prefix, str(tmp_path / "caches"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gathered = json.loads(out.read_text())
    assert [g["rank"] for g in gathered] == [0, 1] and all(g["world"] == 2 for g in gathered)
    a, b = (set(g["names"]) for g in gathered)
    assert a and b and not (a & b), "each rank staged its own share"
    assert a | b == set(ds.sizes)
    assert [g["fetched"] for g in gathered] == [len(a), len(b)]


def test_prefetcher_fills_up_to_ahead_past_the_reader(dataset, tmp_path):
    ds, source = dataset
    order = sorted(source.list(), key=lambda e: e.name)
    cache = Cache(tmp_path / "c")
    pf = Prefetcher(source, cache, order, ahead=10, width=4)
    pf.advance(0)
    pf.wait()
    assert [cache.contains(source, e) for e in order] == [True] * 10 + [False] * 38
    pf.advance(6)
    pf.wait()
    pf.close()
    assert [cache.contains(source, e) for e in order] == [True] * 16 + [False] * 32
    assert pf.errors == []


class _Gated(LocalSource):
    """A folder whose first object waits for a gate; it counts the fetches running at once."""

    def __init__(self, root, slow: str) -> None:
        super().__init__(root)
        self.slow, self.gate, self.lock = slow, threading.Event(), threading.Lock()
        self.running = self.most = 0
        self.pause = 0.01  # seconds each fetch takes

    def fetch(self, entry, out, start=0, timeout=None):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if entry.name == self.slow:
                assert self.gate.wait(30)
            time.sleep(self.pause)
            return super().fetch(entry, out, start, timeout)
        finally:
            with self.lock:
                self.running -= 1


def _gated_folder(tmp_path, files: int, slow: str):
    """A :class:`_Gated` folder of ``files`` small objects, its entries in name order, and an empty cache."""
    root = tmp_path / "src"
    root.mkdir()
    for i in range(files):
        (root / f"{i:02d}.bin").write_bytes(b"x" * 100)
    source = _Gated(root, slow=slow)
    return source, sorted(source.list(), key=lambda e: e.name), Cache(tmp_path / "c")


def test_prefetcher_keeps_width_fills_going_past_a_slow_one_while_the_reader_waits(tmp_path):
    """One slow object holds one of ``width`` slots: the others keep filling up to ``ahead``
    past the reader, without the reader moving, and never more than ``width`` at once."""
    source, order, cache = _gated_folder(tmp_path, 40, slow="00.bin")
    with Prefetcher(source, cache, order, ahead=24, width=3) as pf:
        deadline = time.monotonic() + 30
        while sum(cache.contains(source, e) for e in order[1:24]) < 23 and time.monotonic() < deadline:
            time.sleep(0.02)
        filled = [cache.contains(source, e) for e in order]
        source.gate.set()
    assert filled == [False] + [True] * 23 + [False] * 16, "all but the slow one, up to ahead past the reader"
    assert source.most == 3, f"{source.most} fills at once for width 3"
    assert pf.errors == [] and cache.contains(source, order[0])


def test_the_prefetcher_reads_a_folder_32_at_once_as_documented(tmp_path):
    """A Drive or gcsfuse folder is latency-bound: the prefetcher's default width for a folder source is
    ``DEFAULT_WORKERS`` (32) fills at once, and that many really run (a pool of 8 threads once capped it)."""
    from dataferry.staging import DEFAULT_WORKERS

    source, order, cache = _gated_folder(tmp_path, 64, slow="none")
    source.pause = 0.1  # a folder 100 ms away, as a mounted Drive is
    with Prefetcher(source, cache, order) as pf:
        pf.advance(0)
        deadline = time.monotonic() + 30
        while not all(cache.contains(source, e) for e in order[:DEFAULT_WORKERS]) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert pf.width == DEFAULT_WORKERS == 32
    assert source.most == DEFAULT_WORKERS, f"{source.most} fills at once, not the documented {DEFAULT_WORKERS}"


def test_the_prefetcher_tops_its_window_up_a_whole_batch_at_a_time(tmp_path):
    """A reader moving one sample at a time queues a batch (``width // 8``) each time the window has room for
    one, not one fill a sample (each a hand-over that a warm epoch's reader paid for, fetching nothing); and the
    window still ends ``ahead`` past the reader, the last batch shorter."""
    source, order, cache = _gated_folder(tmp_path, 50, slow="none")
    source.pause = 0
    queued: list[int] = []
    fill_later = cache.fill_later
    cache.fill_later = lambda src, items, threads=32: queued.append(len(items)) or fill_later(src, items, threads)
    with Prefetcher(source, cache, order, ahead=16, width=32) as pf:  # batches of 4
        for position in range(len(order)):
            pf.advance(position)
            pf.wait()  # the fills keep up with the reader: on a busy machine, fills that lag reach ``width`` in
            # flight, and each one that ends then frees one slot, which a top-up fills at once (a batch of 1)
            if position == 5:
                assert [cache.contains(source, e) for e in order[:21]] == [True] * 20 + [False]
    assert queued == [4] * 12 + [2], queued
    assert all(cache.contains(source, e) for e in order) and pf.errors == []


def test_the_prefetcher_passes_over_what_the_reader_needs_no_source_for_and_keeps_no_room_for_it(tmp_path):
    """Entries for which ``needs_source`` is False (decode-once's cached records) are not fetched and take none of
    the budget's room ahead: the window reaches as many fetched bytes past them as without them."""
    source, order, _ = _gated_folder(tmp_path, 30, slow="none")
    source.pause = 0
    cache = Cache(tmp_path / "budget", max_bytes=1_000, min_free_bytes=0)  # 500 bytes ahead: five 100-byte files
    with Prefetcher(source, cache, order, ahead=30, width=8, needs_source=lambda e: e.name >= "10") as pf:
        pf.wait()
        assert [cache.contains(source, e) for e in order] == [False] * 10 + [True] * 5 + [False] * 15
        pf.advance(12)
        pf.wait()
        assert [cache.contains(source, e) for e in order[10:]] == [True] * 7 + [False] * 13
    assert pf.errors == []


def test_dataset_reads_through_cache_with_prefetching_sampler(lab, dataset, tmp_path):
    ds, source = dataset
    lab.set_profile(Profile("test-prefetch", 20, None))
    cache = Cache(tmp_path / "c")
    dataset = CachedDataset(source, cache)
    assert len(dataset) == 48 and dataset.total_bytes == 48 * 30_000
    sampler = dataset.prefetching(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)), ahead=16)
    seen = {}
    for i in sampler:
        seen[i] = dataset[i]
    assert len(seen) == 48
    for i, data in seen.items():
        assert data == ds.content(dataset.entries[i].name)
    assert set(lab.downloads(source.bucket).values()) == {1}
    assert sampler.prefetcher.errors == []


def test_prefetching_under_a_budget_5x_smaller_than_the_data_downloads_each_object_once(lab, dataset, tmp_path):
    """The window ahead of the reader stays within half the budget: a prefetched object is not evicted
    before its read (then downloaded again), however large ``ahead`` is."""
    ds, source = dataset
    lab.set_profile(Profile("test-prefetch-budget", 5, None))
    budget = 48 * 30_000 // 5
    cache = Cache(tmp_path / "c", max_bytes=budget, min_free_bytes=0)
    dataset = CachedDataset(source, cache)
    sampler = dataset.prefetching(RandomSampler(dataset, generator=torch.Generator().manual_seed(1)), ahead=40)
    seen = {i: dataset[i] for i in sampler}
    assert len(seen) == 48 and all(data == ds.content(dataset.entries[i].name) for i, data in seen.items())
    assert set(lab.downloads(source.bucket).values()) == {1}, "each object once, none evicted before its read"
    assert cache.usage()[1] <= budget and sampler.prefetcher.errors == []


def test_dataloader_workers_under_a_budget_5x_smaller_download_each_object_once(lab, dataset, tmp_path):
    """Workers read behind the sampler (batch x workers x prefetch_factor samples); a sample read this
    epoch makes room before one fetched ahead and not yet read, so the fetched-ahead survive to be read."""
    ds, source = dataset
    lab.set_profile(Profile("test-workers-budget", 10, None))
    budget = 48 * 30_000 // 5
    cache = Cache(tmp_path / "c", max_bytes=budget, min_free_bytes=0)
    dataset = CachedDataset(source, cache)
    for epoch in range(3):
        sampler = dataset.prefetching(RandomSampler(dataset, generator=torch.Generator().manual_seed(epoch)))
        got = list(DataLoader(dataset, batch_size=1, num_workers=2, prefetch_factor=1, sampler=sampler,
                              collate_fn=lambda b: b[0]))  # 2 samples read ahead: within half the budget
        assert sorted(got) == sorted(ds.content(e.name) for e in dataset.entries)
        most = max(lab.downloads(source.bucket).values())
        assert most <= epoch + 1, f"epoch {epoch + 1}: an object fetched {most} times, evicted before its read"


def _decode(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data[:8]), dtype=torch.uint8)


def _say_where_a_stuck_worker_waits(_: int) -> None:
    """A worker that has not finished in 100 s writes every thread's stack to stderr (pytest shows it with
    the failure): a fork-inherited lock would show here. Once, in the whole suite, a forked worker hung."""
    import faulthandler

    faulthandler.dump_traceback_later(100)


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("with_client", [False, True], ids=["default-client", "given-client"])
def test_dataloader_workers_fork_and_spawn(lab, dataset, tmp_path, start, with_client):
    ds, source = dataset
    if with_client:
        source = GCSSource(source.bucket, source.prefix, client=lab.client())
    dataset = CachedDataset(source, Cache(tmp_path / "c"), decode=_decode)
    copy = pickle.loads(pickle.dumps(dataset))  # what spawn does
    assert copy.source._client is None, "no live client crosses a pickle: the worker makes its own"
    assert copy.cache._index._writer is None and copy.cache.stats().hits == 0, "nor the cache's thread or counters"
    assert torch.equal(copy[0], _decode(ds.content(copy.entries[0].name))), "and the copy reads on its own"
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=start, timeout=120,
                        worker_init_fn=_say_where_a_stuck_worker_waits)
    batches = list(loader)
    got = torch.cat(batches)
    want = torch.stack([_decode(ds.content(e.name)) for e in dataset.entries])
    assert torch.equal(got, want)
    assert len(Cache(tmp_path / "c").entries()) == 48
    assert set(lab.downloads(source.bucket).values()) == {1}


def test_dataset_over_a_local_folder(tmp_path):
    ds = plan_dataset(6, 100, seed=1, shard_bytes=None).write_to(tmp_path / "src")
    dataset = CachedDataset(LocalSource(tmp_path / "src" / "data" / "files"), Cache(tmp_path / "c"))
    assert [dataset[i] for i in range(6)] == [ds.content(k) for k in sorted(ds.sizes)]
    assert "6 samples" in repr(dataset)


def test_dataset_reads_a_replaced_object_in_its_new_version(lab, dataset, tmp_path):
    ds, source = dataset
    dataset = CachedDataset(source, Cache(tmp_path / "c"))
    lab.client().bucket(source.bucket).blob(source.prefix + dataset.entries[0].name).upload_from_string(b"v2")
    assert dataset[0] == b"v2"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dataferry.course.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_stage_and_cache_commands(dataset, tmp_path):
    ds, source = dataset
    root = str(tmp_path / "c")
    proc = _cli("stage", f"gs://{source.bucket}/{source.prefix}", "--cache", root, "--in-flight", "4")
    assert proc.returncode == 0, proc.stderr
    assert "staged 48 files: 48 downloaded" in proc.stdout and "warning" not in proc.stderr.lower()
    old_name = _cli("stage", f"gs://{source.bucket}/{source.prefix}", "--cache", str(tmp_path / "w"), "--workers", "4")
    assert old_name.returncode == 0 and "caps" in old_name.stderr and "in_flight=4" in old_name.stderr, old_name.stderr
    assert "Traceback" not in old_name.stderr
    inspect = _cli("cache", "inspect", root).stdout
    assert "48 entries" in inspect and f"gs://{source.bucket}/{source.prefix}: 48 objects, 1.4 MB" in inspect
    assert _cli("cache", "verify", root).returncode == 0
    victim = next(p for p in (tmp_path / "c" / "objects").rglob("*") if p.is_file())
    victim.write_bytes(b"garbage")
    bad = _cli("cache", "verify", root)
    assert bad.returncode == 1 and "bad: gs://" in bad.stdout and "size 7, expected 30000" in bad.stdout
    assert "evicted 37 entries" in _cli("cache", "prune", root, "--max-bytes", "300000").stdout
    assert "0 entries" in _cli("cache", "clear", root).stdout
    missing = _cli("stage", str(tmp_path / "nope"), "--cache", root)
    assert missing.returncode == 2 and "is not a folder" in missing.stderr and "Traceback" not in missing.stderr


def test_a_byte_flipped_in_the_cached_copy_is_never_returned_by_the_dataset(tmp_path):
    """CachedDataset checks each read against the CRC32C computed when the object was filled: a copy
    damaged on local disk since is dropped and read again from the source, never given to training."""
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.bin").write_bytes(bytes([i]) * 50_000)
    cache = Cache(tmp_path / "c", min_free_bytes=0)
    ds = CachedDataset(LocalSource(root), cache)
    assert [ds[i] for i in range(4)] == [bytes([i]) * 50_000 for i in range(4)]
    path = cache.path(ds.source, ds.entry(2))
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01  # same size: a size check cannot see it
    path.write_bytes(bytes(data))
    assert ds[2] == bytes([2]) * 50_000
    assert cache.stats().refetches == 1


@pytest.mark.parametrize("kind", ["folder", "bucket"])
def test_a_stage_larger_than_the_cache_says_what_is_left_and_what_was_evicted(dataset, tmp_path, kind):
    """16 objects into room for 4: the report and the CLI say only 4 remain, not '16 downloaded, 0 failures'."""
    ds, source = dataset
    if kind == "folder":
        root = tmp_path / "src"
        root.mkdir()
        for i in range(16):
            (root / f"{i:02d}.bin").write_bytes(bytes([i]) * 30_000)
        source = LocalSource(root)
    names = sorted(e.name for e in source.list())[:16]
    cache = Cache(tmp_path / "c", min_free_bytes=0, max_bytes=4 * 30_000)
    report = stage(source, cache, names=names, in_flight=1, progress=False)  # one at a time: each fill finds room
    assert (report.fetched, report.failures) == (16, [])
    assert report.kept == 4 and report.evicted == 12, report
    assert report.kept == sum(cache.contains(source, source.stat(n)) for n in names)
    assert "only 4 of 16 are in the cache" in str(report) and "12 were evicted" in str(report)


def test_cli_stage_of_an_empty_prefix_says_nothing_matched(dataset, tmp_path):
    ds, source = dataset
    exe = str(Path(sys.executable).parent / "dataferry")
    proc = subprocess.run([exe, "stage", f"gs://{source.bucket}/no/such/prefix/", "--cache", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "nothing to stage" in proc.stderr and "no/such/prefix" in proc.stderr, proc.stderr


def test_a_folder_on_local_disk_is_left_to_the_workers_and_a_mounted_one_is_fetched_ahead(gcsfuse_lab, lab_bucket,
                                                                                         tmp_path):
    """From local disk, the main process's prefetch threads only race the DataLoader's workers for the same
    files (on a 16-CPU GPU machine, epoch 1 from a folder ran at 1,919 files/s with them, 3,327 without:
    scripts/gpu_feed.py); a FUSE mount (the lab's real gcsfuse, as Drive in Colab) waits on the network, and
    is still fetched ahead. Either way the sampler yields the wrapped sampler's indices."""
    from dataferry.host import filesystem_of, mount_of, on_network_filesystem

    assert filesystem_of("/proc") == "proc" and mount_of("/proc/self") == ("/proc", "proc")
    local = tmp_path / "photos"
    local.mkdir()
    for i in range(12):
        (local / f"{i:02d}.jpg").write_bytes(bytes([i]) * 100)
    for i in range(12):
        lab_bucket.blob(f"m/{i:02d}.jpg").upload_from_string(bytes([i]) * 100)
    assert not on_network_filesystem(local) and not LocalSource(local).remote
    with gcsfuse_lab.mount(lab_bucket.name) as m:
        mounted = LocalSource(m.mountpoint / "m")
        assert filesystem_of(mounted.root).startswith("fuse") and mounted.remote
        for source, fetched_ahead in ((LocalSource(local), False), (mounted, True)):
            dataset = CachedDataset(source, Cache(tmp_path / f"c-{fetched_ahead}", min_free_bytes=0))
            order = list(RandomSampler(dataset, generator=torch.Generator().manual_seed(3)))
            sampler = dataset.prefetching(RandomSampler(dataset, generator=torch.Generator().manual_seed(3)))
            assert [i for i in sampler if dataset[i] == bytes([i]) * 100] == order
            assert (sampler.prefetcher is not None) is fetched_ahead, source


def _four_local_samples(tmp_path, **cache_options):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.bin").write_bytes(bytes([i]) * 50_000)
    return CachedDataset(LocalSource(root), Cache(tmp_path / "c", min_free_bytes=0, **cache_options))


def test_a_sample_read_again_in_the_same_process_asks_the_index_nothing_and_is_still_checked(tmp_path):
    """A warm epoch in a persistent worker reads each sample it has read before by the key, size and CRC32C its
    first checked read learned: no query of the index (which cost a tenth of decode-once's sample in a worker).
    It is still checked and counted: a byte flipped since is never returned, a copy evicted since is filled."""
    ds = _four_local_samples(tmp_path)
    assert [ds[i] for i in range(4)] == [bytes([i]) * 50_000 for i in range(4)]
    statements: list[str] = []
    ds.cache._index.db().set_trace_callback(statements.append)
    assert [ds[i] for i in (3, 1, -4)] == [bytes([3]) * 50_000, bytes([1]) * 50_000, bytes([0]) * 50_000]
    assert statements == [], "a sample read before is read with no query of the index"
    assert ds.cache.stats().hits == 3 and ds.cache.stats().bytes_from_cache == 3 * 50_000
    path = ds.cache.path(ds.source, ds.entry(2))
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01
    path.write_bytes(bytes(data))
    assert ds[2] == bytes([2]) * 50_000 and ds.cache.stats().refetches == 1, "damaged since: read again, not served"
    ds.cache.clear()
    before = ds.cache.stats()
    assert ds[1] == bytes([1]) * 50_000 and (ds.cache.stats() - before).misses == 1, "evicted since: filled again"
    assert ds[-1] == bytes([3]) * 50_000


class _Regenerated:
    """A source whose bytes can change under an unchanged version, as decode-once's records can when another
    Pillow or libjpeg decodes them again: what a cache keys by version cannot tell the two apart."""

    uri = "regenerated://"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def list(self):
        yield self.stat("x.bin")

    def stat(self, name):
        from dataferry.sources import Entry
        return Entry(name, len(self.data), "v1", None)

    def fetch(self, entry, out, start=0, timeout=None):
        return out.write(self.data[start:])


def test_a_copy_filled_again_with_other_bytes_under_its_key_is_read_as_the_index_now_vouches(tmp_path):
    """What a first read learned is only a shortcut: a copy another process filled again under the same key, with
    other bytes its fill checked, reads back as the index now says, not as damage on the disk."""
    source = _Regenerated(b"first decoder " * 1000)
    ds = CachedDataset(source, Cache(tmp_path / "c", min_free_bytes=0))
    assert ds[0] == b"first decoder " * 1000
    other = Cache(tmp_path / "c", min_free_bytes=0)
    other.clear()
    source.data = b"other decoder " * 1000
    assert other.read(source, "x.bin") == b"other decoder " * 1000
    assert ds[0] == b"other decoder " * 1000 and ds.cache.stats().refetches == 0


def test_a_sample_read_again_under_a_budget_is_demoted_as_on_its_first_read(tmp_path):
    """Under a budget every read of a sample marks it used up for this epoch, its first and its later ones: when
    room is needed the samples read go first, the one read last first."""
    ds = _four_local_samples(tmp_path, max_bytes=150_000)  # room for three
    for i in (0, 1, 2):
        ds[i]
    for i in (2, 1, 0):  # read again: 0 was read last
        ds[i]
    ds[3]
    assert [ds.cache.contains(ds.source, ds.entry(i)) for i in range(4)] == [False, True, True, True]


def test_what_reads_learned_does_not_cross_a_pickle_and_a_refresh_forgets_it(tmp_path):
    """What a process's reads learned stays in it: a pickled dataset (what spawn sends a worker) carries none of it,
    and a refresh, which may list other versions, starts afresh."""
    ds = _four_local_samples(tmp_path)
    ds[0]
    copy = pickle.loads(pickle.dumps(ds))
    statements: list[str] = []
    copy.cache._index.db().set_trace_callback(statements.append)
    assert copy[0] == bytes([0]) * 50_000
    assert any("crc32c" in s for s in statements), "the copy learned nothing across the pickle: it asks the index"
    copy.cache._index.db().set_trace_callback(None)
    (tmp_path / "src" / "0.bin").write_bytes(b"v2")
    ds.refresh()
    assert ds[0] == b"v2"


def test_what_one_worker_learned_every_process_of_the_loader_uses(tmp_path):
    """A shuffled sample goes to any worker each epoch: what one worker's checked read learned of its copy is shared
    with the loader's other workers and the process that made them (forked), so a warm epoch reads every sample
    without asking the index, whichever worker read it first."""
    ds = _four_local_samples(tmp_path)
    loader = DataLoader(ds, batch_size=1, num_workers=2, multiprocessing_context="fork")
    assert [batch[0] for batch in loader] == [bytes([i]) * 50_000 for i in range(4)]
    statements: list[str] = []
    ds.cache._index.db().set_trace_callback(statements.append)
    assert [ds[i] for i in range(4)] == [bytes([i]) * 50_000 for i in range(4)]
    assert statements == [], "the workers' reads taught this process every copy"


def test_a_scribbled_record_of_what_a_read_learned_is_not_used(tmp_path):
    """What reads learned sits in memory every worker writes to: a record torn by two writers, or scribbled on, fails
    its own check and the sample is read as on its first read."""
    ds = _four_local_samples(tmp_path)
    assert ds[1] == bytes([1]) * 50_000
    table = ds._copies._table
    record = len(table) // 4
    for flip in (0, 33, 43, record - 1):  # the key, the CRC32C, the size's top byte and the record's own check
        ds[1]
        table[record + flip] ^= 0x01
        statements: list[str] = []
        ds.cache._index.db().set_trace_callback(statements.append)
        assert ds[1] == bytes([1]) * 50_000
        assert any("crc32c" in s for s in statements), "read as on its first read, checked by the index"
        ds.cache._index.db().set_trace_callback(None)
    key = ds.cache.key(ds.source, ds.entry(1))
    assert ds.cache.reread(key, 1 << 60, 0) is None, "never asks for more than the copy holds, whatever a record says"
    assert ds._copies.read(ds.cache, 4, False) is None, "a table shorter than the listing a read began with"
    ds._copies.learn(4, key, b"x")


def test_a_dataset_given_another_source_after_it_was_made_shares_what_its_workers_learn(tmp_path):
    """Setting what decides which copy a sample reads (here the source, as a copy for another folder would) makes
    the dataset's new table at once, before its workers fork, so that they still share it."""
    import copy

    ds = _four_local_samples(tmp_path)
    (tmp_path / "other").mkdir()
    for i in range(4):
        (tmp_path / "other" / f"{i}.bin").write_bytes(bytes([10 + i]) * 50_000)
    other = copy.copy(ds)
    other.source = LocalSource(tmp_path / "other")
    other.refresh()
    other.source = LocalSource(tmp_path / "other")  # another one, after the listing: a new table, shared
    loader = DataLoader(other, batch_size=1, num_workers=2, multiprocessing_context="fork")
    assert [batch[0] for batch in loader] == [bytes([10 + i]) * 50_000 for i in range(4)]
    statements: list[str] = []
    other.cache._index.db().set_trace_callback(statements.append)
    assert [other[i] for i in range(4)] == [bytes([10 + i]) * 50_000 for i in range(4)]
    assert statements == [], "the workers' reads taught this process every copy"
    assert [ds[i] for i in range(4)] == [bytes([i]) * 50_000 for i in range(4)], "the original reads its own"


def test_a_sample_found_replaced_at_the_source_is_not_read_by_what_reads_of_its_listed_version_learned(tmp_path):
    """A sample whose listed version was gone at the source before it was cached is read in its new version, and
    then always the slow way: what reads learn is of the listed versions, shared with processes that read those."""
    ds = _four_local_samples(tmp_path)
    (tmp_path / "src" / "2.bin").write_bytes(b"v2" * 100)
    assert ds[2] == b"v2" * 100
    statements: list[str] = []
    ds.cache._index.db().set_trace_callback(statements.append)
    assert ds[2] == b"v2" * 100
    assert any("crc32c" in s for s in statements), "read as on its first read, checked by the index"


def test_a_read_under_way_while_the_source_is_set_learns_nothing_for_the_new_one(tmp_path):
    """A read that began before another thread set the dataset's source (and listed it) learns what it read into
    no table: the new source's samples are never read as the old one's copies."""
    ds = _four_local_samples(tmp_path)
    (tmp_path / "other").mkdir()
    for i in range(4):
        (tmp_path / "other" / f"{i}.bin").write_bytes(bytes([10 + i]) * 50_000)
    read = ds.cache.read_verified

    def read_then_switch(source, entry):
        data = read(source, entry)
        ds.source = LocalSource(tmp_path / "other")  # what another thread did meanwhile
        ds.refresh()
        return data

    ds.cache.read_verified = read_then_switch
    assert ds[0] == bytes([0]) * 50_000
    ds.cache.read_verified = read
    assert [ds[i] for i in range(4)] == [bytes([10 + i]) * 50_000 for i in range(4)]


def test_a_copy_of_a_dataset_learns_on_its_own(tmp_path):
    """``copy.copy`` gives a dataset whose reads learn on their own (compare_decoders times each copy from its own
    start), and which keeps its own list of samples found replaced at the source."""
    import copy

    ds = _four_local_samples(tmp_path)
    ds[0]
    twin = copy.copy(ds)
    statements: list[str] = []
    twin.cache._index.db().set_trace_callback(statements.append)
    assert twin[0] == bytes([0]) * 50_000
    assert any("crc32c" in s for s in statements), "the copy asks the index on its first read"
    twin.cache._index.db().set_trace_callback(None)
    twin._replaced[1] = twin.entry(1)
    assert 1 not in ds._replaced
