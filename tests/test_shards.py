"""Tar shards through the cache, against the lab: making them, every sample once per epoch across ranks and
workers, seeded order, a budget 5x smaller than the data, corruption, and bad input."""

import io
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from dataferry import Cache, GCSSource, LocalSource
from dataferry.course.lab import plan_dataset
from dataferry.shards import INDEX, ShardDataset, ShardFormatError, ShardLoader, make_shards, read_index, samples

N, SIZE, SHARD = 120, 20_000, 110_000  # 24 shards of 5 samples


@pytest.fixture
def sharded(lab_env, lab_bucket):
    ds = plan_dataset(N, SIZE, prefix="d", seed=5, shard_bytes=None).upload(lab_bucket)
    made = make_shards(GCSSource(lab_bucket.name, "d/files/"), f"gs://{lab_bucket.name}/d/packed",
                       shard_bytes=SHARD, progress=False)
    return ds, GCSSource(lab_bucket.name, "d/packed/"), made


def _epoch(ds_shards, workers=0, **dl):
    return list(DataLoader(ds_shards, batch_size=None, num_workers=workers, **dl))


def test_make_shards_packs_every_file_once_with_an_index(sharded):
    ds, source, made = sharded
    index = read_index(source)
    assert index["samples"] == N and len(index["shards"]) == len(made) == 24
    listed = {e.name: e for e in source.list()}
    assert set(listed) == {s.name for s in made} | {INDEX}
    keys = []
    for shard in index["shards"]:
        e = listed[shard["name"]]
        assert (e.size, e.crc32c) == (shard["bytes"], shard["crc32c"])
        assert shard["bytes"] <= SHARD + 10 * 1024, "the target, and the last tar record padded"
        buf = io.BytesIO()
        source.fetch(e, buf)
        got = list(samples(buf.getvalue(), e.name))
        assert [s["__key__"] for s in got] == shard["keys"] and shard["samples"] == len(got)
        for s in got:
            assert s["bin"] == ds.content(s["__key__"] + ".bin")
        keys += shard["keys"]
    assert sorted(keys) == sorted(k.removesuffix(".bin") for k in ds.sizes) and len(set(keys)) == N


def test_every_sample_exactly_once_per_epoch_across_2_ranks_x_3_workers(sharded, tmp_path):
    ds, source, _ = sharded
    for epoch in (0, 1):
        seen = Counter()
        for rank in (0, 1):
            shards = ShardDataset(source, Cache(tmp_path / f"rank{rank}"), rank=rank, world_size=2, shuffle=7)
            shards.set_epoch(epoch)
            got = _epoch(shards, workers=3)
            for s in got:
                assert s["bin"] == ds.content(s["__key__"] + ".bin")
            seen.update(s["__key__"] for s in got)
        assert set(seen.values()) == {1} and len(seen) == N, f"epoch {epoch}: every sample once"


def test_one_seed_one_order_two_seeds_two_orders(sharded, tmp_path):
    ds, source, _ = sharded
    cache = Cache(tmp_path / "c")

    def order(seed, epoch):
        shards = ShardDataset(source, cache, seed=seed, shuffle=20)
        shards.set_epoch(epoch)
        return [s["__key__"] for s in shards]

    first = order(0, 0)
    assert order(0, 0) == first
    assert order(1, 0) != first and sorted(order(1, 0)) == sorted(first)
    assert order(0, 1) != first, "each epoch its own order"
    flat = [s["__key__"] for s in ShardDataset(source, cache, shuffle=0)]
    assert first != flat, "the buffer mixes samples, not only shards"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    seen = {}
    for sub in ("objects",):  # whole objects and fills in progress
        for dirpath, _, files in os.walk(root / sub):
            for f in files:
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except FileNotFoundError:
                    continue
                seen[os.path.join(dirpath, f)] = (st.st_ino, st.st_size)
    return seen


def _disk_bytes(root: Path) -> int:
    """Bytes of the cache's files at one instant (a lower bound of it, never more): a walk is not atomic, but
    every file seen in two walks in a row existed at the instant between them, at least as large as first seen."""
    first, second = _files(root), _files(root)
    return sum(min(size, second[path][1]) for path, (ino, size) in first.items()
               if path in second and second[path][0] == ino)


def _shard_downloads(lab, source) -> int:
    return sum(n for name, n in lab.downloads(source.bucket).items() if name.startswith(source.prefix) and name.endswith(".tar"))


def test_data_five_times_the_budget_streams_under_it_and_keeps_what_fits(lab, sharded, tmp_path):
    ds, source, made = sharded
    total = sum(s.bytes for s in made)
    budget = total // 5
    cache = Cache(tmp_path / "c", max_bytes=budget, min_free_bytes=0)
    shards = ShardDataset(source, cache, shuffle=10, ahead=2)
    peak, stop = [0], threading.Event()

    def sample_disk():
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_bytes(cache.root), cache.usage()[1])
            stop.wait(0.002)

    sampler = threading.Thread(target=sample_disk)
    sampler.start()
    try:
        got1 = [s["__key__"] for s in shards]
        kept = cache.usage()[0]
        after1 = _shard_downloads(lab, source)
        shards.set_epoch(1)
        got2 = [s["__key__"] for s in shards]
        after2 = _shard_downloads(lab, source)
    finally:
        stop.set()
        sampler.join()
    assert sorted(got1) == sorted(got2) and len(set(got1)) == N
    assert 0 < peak[0] <= budget, f"disk peaked at {peak[0]} bytes, budget {budget}"
    assert after1 == len(made), f"epoch 1: each shard once ({after1} downloads)"
    assert kept >= 2, "the cache kept what fitted"
    d2 = after2 - after1
    assert len(made) - kept <= d2 <= len(made) - kept + 3, \
        f"epoch 2 downloaded {d2} of {len(made)} shards with {kept} kept: only what did not fit, and the prefetch"


def test_three_workers_under_a_budget_of_five_shards_download_each_shard_once(lab, sharded, tmp_path):
    """Three workers each filling two ahead would need nine shards on disk: each fills fewer ahead
    rather than evict a shard another worker filled and has not read yet."""
    ds, source, made = sharded
    budget = 5 * max(s.bytes for s in made)
    shards = ShardDataset(source, Cache(tmp_path / "c", max_bytes=budget, min_free_bytes=0), shuffle=10, ahead=2)
    got = _epoch(shards, workers=3)
    assert sorted(s["__key__"] for s in got) == sorted(k for s in made for k in s.keys)
    assert _shard_downloads(lab, source) == len(made), "each shard once in epoch 1"


def test_shards_that_fit_read_no_network_in_epoch_2(lab, sharded, tmp_path):
    ds, source, made = sharded
    shards = ShardDataset(source, Cache(tmp_path / "c"), shuffle=10)
    first = _epoch(shards, workers=2)
    before = lab.downloads(source.bucket)
    shards.set_epoch(1)
    second = _epoch(shards, workers=2)
    assert lab.downloads(source.bucket) == before
    assert sorted(s["__key__"] for s in first) == sorted(s["__key__"] for s in second)


def test_a_corrupted_shard_byte_is_refetched_never_yielded(lab, sharded, tmp_path):
    ds, source, made = sharded
    cache = Cache(tmp_path / "c")
    shards = ShardDataset(source, cache, shuffle=0)
    list(shards)
    victim = next(e for e in source.list() if e.name == made[3].name)
    path = cache.path(source, victim)
    data = bytearray(path.read_bytes())
    data[600] ^= 0x40  # inside the first member's data (its header is the first 512 bytes)
    path.write_bytes(bytes(data))
    for s in shards:
        assert s["bin"] == ds.content(s["__key__"] + ".bin"), s["__key__"]
    assert cache.stats().refetches == 1
    assert lab.downloads(source.bucket)[f"d/packed/{victim.name}"] == 2


def test_decode_gets_the_sample_and_is_applied(sharded, tmp_path):
    ds, source, _ = sharded
    shards = ShardDataset(source, Cache(tmp_path / "c"), decode=_size_of, shuffle=0)
    got = _epoch(shards, workers=2)
    assert len(got) == N and {g[1] for g in got} == {SIZE}


def _size_of(sample):
    return sample["__key__"], len(sample["bin"])


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "README").write_bytes(b"no extension")
    with pytest.raises(ShardFormatError, match="has no extension"):
        make_shards(LocalSource(tmp_path / "files"), tmp_path / "out", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        ShardDataset(LocalSource(tmp_path / "empty"), Cache(tmp_path / "c"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tar").write_bytes(b"not a tar" * 100)
    with pytest.raises(ShardFormatError, match="is not a tar shard"):
        list(ShardDataset(LocalSource(tmp_path / "bad"), Cache(tmp_path / "c2")))
    with pytest.raises(ValueError, match="rank must be in"):
        ShardDataset(LocalSource(tmp_path / "bad"), Cache(tmp_path / "c3"), rank=2, world_size=2)


def test_shards_from_a_folder_to_a_folder(tmp_path):
    src = tmp_path / "files"
    for i in range(10):
        (src / f"{i:02d}").mkdir(parents=True)
        (src / f"{i:02d}" / "img.jpg").write_bytes(os.urandom(3000))
        (src / f"{i:02d}" / "img.cls").write_bytes(str(i).encode())
    made = make_shards(LocalSource(src), tmp_path / "shards", shard_bytes=15_000, progress=False)  # 3 a shard
    assert len(made) == 4 and json.loads((tmp_path / "shards" / INDEX).read_text())["samples"] == 10
    got = list(ShardDataset(LocalSource(tmp_path / "shards"), Cache(tmp_path / "c"), shuffle=0))
    assert [s["__key__"] for s in sorted(got, key=lambda s: s["__key__"])] == [f"{i:02d}/img" for i in range(10)]
    assert all(s["cls"] == s["__key__"][:2].lstrip("0").encode() or s["cls"] == b"0" for s in got)
    assert all((src / (s["__key__"] + ".jpg")).read_bytes() == s["jpg"] for s in got)


def test_cli_makes_shards_from_a_folder(tmp_path):
    src = tmp_path / "files"
    src.mkdir()
    for i in range(6):
        (src / f"{i}.txt").write_text(str(i) * 1000)
    out = subprocess.run([sys.executable, "-m", "dataferry.course.cli", "shards", "make", str(src), str(tmp_path / "out"),
                          "--shard-mb", "0.004"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "6 samples in 3 shards" in out.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [INDEX, *(f"shard-{i:05d}.tar" for i in range(3))]


def _keys(batch):
    return [s["__key__"] for s in batch]


@pytest.mark.parametrize("workers,batch_size", [(0, 4), (2, 4), (5, 3)])  # 5 workers: 5, 5, 5, 5 and 4 shards
def test_a_saved_position_continues_the_epoch_in_the_same_order(sharded, tmp_path, workers, batch_size):
    ds, source, _ = sharded

    def loader():
        return ShardLoader(ShardDataset(source, Cache(tmp_path / "c"), shuffle=9, seed=1), batch_size=batch_size,
                           num_workers=workers, collate_fn=_keys)

    whole = loader()
    whole.set_epoch(2)
    batches, states = [], []
    for batch in whole:
        batches.append(batch)
        states.append(whole.state_dict())
    assert sorted(k for b in batches for k in b) == sorted(k.removesuffix(".bin") for k in ds.sizes)
    for k in (1, len(batches) // 2, len(batches) - 2):
        again = loader()
        again.load_state_dict(states[k - 1])
        again.set_epoch(2)
        rest = list(again)
        assert [key for b in rest for key in b] == [key for b in batches[k:] for key in b], f"after {k} batches"
        assert again.state_dict()["batches"] == len(batches)
        if workers == 0 and k == len(batches) - 2:
            reads = again.dataset.cache.stats()
            left = sum(map(len, rest))
            assert reads.hits + reads.misses <= left < 24, f"replayed from the index: {reads} for {left} samples"


def test_resume_refuses_other_settings(sharded, tmp_path):
    ds, source, _ = sharded
    one = ShardLoader(ShardDataset(source, Cache(tmp_path / "c"), seed=1), batch_size=4, num_workers=2)
    state = one.state_dict()
    other = ShardLoader(ShardDataset(source, Cache(tmp_path / "c"), seed=1), batch_size=4, num_workers=3)
    with pytest.raises(ValueError, match="num_workers 2 .now 3."):
        other.load_state_dict(state)


def test_sigkill_mid_epoch_then_resume_gives_the_rest_exactly_once(lab, sharded, tmp_path):
    ds, source, made = sharded
    script = [sys.executable, str(Path(__file__).parent / "scripts" / "shard_resume.py"), source.bucket,
              source.prefix, str(tmp_path / "c")]
    killed = subprocess.run([*script, str(tmp_path / "state.json"), "1", "7"], capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stderr
    before = json.loads((tmp_path / "state.json").read_text())["keys"]
    assert len(before) == 28
    rest = subprocess.run([*script, str(tmp_path / "state.json"), "1", "0"], capture_output=True, text=True,
                          timeout=300)
    assert rest.returncode == 0, rest.stderr
    after = json.loads(rest.stdout)
    assert sorted(before + after) == sorted(k.removesuffix(".bin") for k in ds.sizes), "each sample exactly once"
    whole = subprocess.run([*script, str(tmp_path / "fresh.json"), "1", "0"], capture_output=True, text=True,
                           timeout=300)
    assert before + after == json.loads(whole.stdout), "the same order as a run that was not interrupted"
    assert _shard_downloads(lab, source) == len(made), "one download a shard: the killed run's cache was kept"


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_a_shard_damaged_at_the_source_is_refused_by_its_indexed_crc32c_never_yielded(lab, sharded, tmp_path,
                                                                                        where):
    """The index records each shard's CRC32C when it is made; a shard changed since (a byte flipped at the
    source) fails it: a clear error naming the shard, and no sample of it reaches training."""
    from dataferry import ChecksumError

    ds, source, made = sharded
    victim = made[3].name
    if where == "folder":
        folder = tmp_path / "shards"
        folder.mkdir()
        for e in source.list():
            buf = io.BytesIO()
            source.fetch(e, buf)
            (folder / e.name).write_bytes(buf.getvalue())
        path = folder / victim
        data = bytearray(path.read_bytes())
        data[600] ^= 0x40  # inside the first member's data
        path.write_bytes(bytes(data))
        source = LocalSource(folder)
    else:  # the object rewritten in place: its own CRC32C describes the damaged bytes
        blob = lab.client().bucket(source.bucket).blob(f"d/packed/{victim}")
        data = bytearray(blob.download_as_bytes())
        data[600] ^= 0x40
        blob.upload_from_string(bytes(data))
    shards = ShardDataset(source, Cache(tmp_path / "c", min_free_bytes=0), shuffle=0)
    given = []
    with pytest.raises(ChecksumError, match=rf"{victim}.*CRC32C.*{INDEX}"):
        for s in shards:
            given.append(s)
    for s in given:
        assert s["bin"] == ds.content(s["__key__"] + ".bin"), s["__key__"]


def _shard_folder(tmp_path):
    src = tmp_path / "files"
    for i in range(12):
        (src / f"{i:02d}").mkdir(parents=True)
        (src / f"{i:02d}" / "img.bin").write_bytes(os.urandom(3000))
    made = make_shards(LocalSource(src), tmp_path / "shards", shard_bytes=15_000, progress=False)  # 3 a shard
    return tmp_path / "shards", made


@pytest.mark.parametrize("change", ["truncated at a member", "another valid tar", "not in the index",
                                    "gone from the source"])
def test_a_shard_whose_size_changed_since_its_index_is_refused_before_a_sample_is_given(tmp_path, change):
    """Every listed shard must be in the index in its recorded size (so its recorded CRC32C applies): a shard cut
    at a member boundary, replaced by another tar, added or deleted since is named, and nothing is yielded."""
    from dataferry.cache import DamagedAtSource

    folder, made = _shard_folder(tmp_path)
    victim = folder / made[1].name
    if change == "truncated at a member":
        victim.write_bytes(victim.read_bytes()[:512 + 3072])  # its first member, whole
    elif change == "another valid tar":
        victim.write_bytes((folder / made[0].name).read_bytes()[:512 + 3072] + b"\0" * 1024)
    elif change == "not in the index":
        (folder / "shard-extra.tar").write_bytes((folder / made[0].name).read_bytes())
    else:
        victim.unlink()
    given = []
    with pytest.raises(DamagedAtSource, match=rf"{INDEX}.*(shard-00001|shard-extra).*remake"):
        for s in ShardDataset(LocalSource(folder), Cache(tmp_path / "c", min_free_bytes=0), shuffle=0):
            given.append(s)
    assert given == []
    if change != "gone from the source" and change != "not in the index":
        with pytest.raises(DamagedAtSource, match="shard-00001"):
            list(ShardDataset(LocalSource(folder), Cache(tmp_path / "c", min_free_bytes=0), shards=[made[1].name]))


def test_a_damaged_index_is_one_clear_line(tmp_path):
    folder, _ = _shard_folder(tmp_path)
    (folder / INDEX).write_text("{not json")
    with pytest.raises(ShardFormatError, match=rf"{INDEX}.*(remake|make)"):
        ShardDataset(LocalSource(folder), Cache(tmp_path / "c", min_free_bytes=0))
