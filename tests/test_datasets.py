"""Synthetic datasets: deterministic, nested, sized as asked, with shards holding the same samples."""

import io
import json
import tarfile

import pytest

from dataferry.course.lab import LogNormal, plan_dataset, sample_bytes


def test_same_seed_same_bytes_other_seed_other_bytes():
    a, b, c = (plan_dataset(10, 1000, seed=s) for s in (1, 1, 2))
    assert a.sizes == b.sizes
    key = next(iter(a.sizes))
    assert a.content(key) == b.content(key) == sample_bytes(1, key, 1000)
    assert a.content(key) != c.content(key)
    assert len({a.content(k) for k in a.sizes}) == 10, "every file has its own bytes"


def test_nested_folders_and_names():
    ds = plan_dataset(40, 10, prefix="/train/", fanout=3, depth=2, shard_bytes=None)
    assert ds.prefix == "train"
    names = ds.object_names
    assert names[0] == "train/files/00/00/sample-000000.bin"
    assert names[4] == "train/files/01/01/sample-000004.bin"
    assert {n.split("/")[2] for n in names} == {"00", "01", "02"}
    assert all(n.count("/") == 4 for n in names)


def test_lognormal_sizes_are_spread_and_clipped():
    ds = plan_dataset(500, LogNormal(64_000, sigma=1.0, min_bytes=1_000, max_bytes=1_000_000), seed=5)
    sizes = sorted(ds.sizes.values())
    assert min(sizes) >= 1_000 and max(sizes) <= 1_000_000
    assert 40_000 < sizes[len(sizes) // 2] < 100_000
    assert sizes[int(0.9 * len(sizes))] > 2 * sizes[len(sizes) // 2]
    assert plan_dataset(500, LogNormal(64_000, 1.0, 1_000, 1_000_000), seed=5).sizes == ds.sizes


def test_shards_hold_every_sample_in_order_byte_exact():
    ds = plan_dataset(30, 10_000, seed=9, shard_bytes=45_000)
    assert len(ds.shards) == 8  # 4 samples of 10 kB fit under 45 kB
    members = []
    for shard in ds.shards:
        data = ds.shard_content(shard)
        assert data == ds.shard_content(shard), "shards are reproducible byte for byte"
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for info in tar.getmembers():
                assert tar.extractfile(info).read() == ds.content(info.name)
                members.append(info.name)
    assert members == list(ds.sizes)


def test_no_shards_and_empty():
    assert plan_dataset(5, 10, shard_bytes=None).shards == {}
    assert plan_dataset(0, 10).total_bytes == 0
    with pytest.raises(ValueError):
        plan_dataset(-1, 10)


def test_upload_writes_samples_shards_and_manifest(lab, lab_bucket):
    ds = lab.make_dataset(lab_bucket.name, 9, LogNormal(2_000, 0.5), prefix="p", seed=4, shard_bytes=8_000)
    names = {b.name for b in lab_bucket.list_blobs()}
    assert names == set(ds.object_names) | set(ds.shards) | {"p/manifest.json"}
    manifest = json.loads(lab_bucket.blob("p/manifest.json").download_as_bytes())
    assert manifest["files"] == ds.sizes and manifest["seed"] == 4
    assert repr(ds).startswith(f"<SyntheticDataset gs://{lab_bucket.name}/p: 9 files")


def test_write_to_folder_matches(tmp_path):
    ds = plan_dataset(3, 100, seed=2).write_to(tmp_path)
    for name in ds.object_names:
        assert (tmp_path / name).read_bytes() == ds.content(name)
