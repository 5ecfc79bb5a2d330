"""Real gcsfuse mounts of lab buckets read the same bytes as the API, with and without file cache."""

import io
import json
import os
import shutil
import tarfile

from pathlib import Path

import pytest

from dataferry.course.lab import BucketNotFound, plan_dataset
from dataferry.mounts import MountError, file_cache_room_mb, is_mounted, mount_gcsfuse
from dataferry.sources import ChangedAtSource


@pytest.fixture(scope="module")
def fuse_dataset(lab):
    bucket = lab.create_bucket("fuse-data")
    ds = plan_dataset(24, 150_000, prefix="ds", seed=3, shard_bytes=1_000_000).upload(bucket)
    yield ds
    lab.delete_bucket("fuse-data")


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("file_cache", [False, True], ids=["no-file-cache", "file-cache"])
def test_gcsfuse_reads_same_bytes(gcsfuse_lab, fuse_dataset, file_cache):
    ds = fuse_dataset
    with gcsfuse_lab.mount("fuse-data", file_cache=file_cache) as m:
        assert is_mounted(m.mountpoint)
        # --implicit-dirs: the nested folders show up without folder placeholder objects.
        assert sorted(os.listdir(m.mountpoint / "ds")) == ["files", "manifest.json", "shards"]
        for name in ds.object_names:
            assert (m.mountpoint / name).read_bytes() == ds.content(name)
        for shard, keys in ds.shards.items():
            with tarfile.open(fileobj=io.BytesIO((m.mountpoint / shard).read_bytes())) as tar:
                assert tar.getnames() == keys
                assert tar.extractfile(keys[0]).read() == ds.content(keys[0])
        if file_cache:
            cached = [p for p in m.cache_dir.rglob("*") if p.is_file()]
            assert len(cached) >= len(ds.object_names), "file cache is on, so every read file is cached"
            # A re-read after page-cache eviction still returns the same bytes (from the file cache).
            _evict(m.mountpoint / ds.object_names[0])
            assert (m.mountpoint / ds.object_names[0]).read_bytes() == ds.content(ds.object_names[0])
        else:
            assert m.cache_dir is None
        point = m.mountpoint
    assert not is_mounted(point)
    assert not point.exists()
    assert gcsfuse_lab.status()["mounts"] == {}


def test_gcsfuse_sees_new_objects_and_writes_nothing_unasked(gcsfuse_lab, lab_bucket):
    lab_bucket.blob("a/b/c.txt").upload_from_string(b"hello")
    with gcsfuse_lab.mount(lab_bucket.name) as m:
        assert (m.mountpoint / "a" / "b" / "c.txt").read_bytes() == b"hello"
    assert [b.name for b in lab_bucket.list_blobs()] == ["a/b/c.txt"]


def test_mount_missing_bucket_is_bucket_not_found(gcsfuse_lab):
    with pytest.raises(BucketNotFound, match="no-such-bucket"):
        gcsfuse_lab.mount("no-such-bucket")


def test_gcsfuse_itself_on_missing_bucket_raises_with_log_tail(gcsfuse_lab, tmp_path):
    """mount_gcsfuse (the Colab path, no lab check first) reports gcsfuse's own words."""
    gcsfuse = gcsfuse_lab.status()["gcsfuse"]["path"]
    with pytest.raises(MountError, match=r"(?s)gs://no-such-bucket does not exist at http://127.*gcsfuse log.*404"):
        mount_gcsfuse("no-such-bucket", tmp_path / "mnt", endpoint=gcsfuse_lab.endpoint, anonymous=True,
                      gcsfuse=gcsfuse, timeout=60)
    assert not is_mounted(tmp_path / "mnt")
    assert not (tmp_path / "mnt").exists(), "the mount point it created is removed again"


def test_mount_onto_non_empty_folder_is_refused(gcsfuse_lab, lab_bucket, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(MountError, match="not empty"):
        mount_gcsfuse(lab_bucket.name, tmp_path, endpoint=gcsfuse_lab.endpoint, anonymous=True,
                      gcsfuse=gcsfuse_lab.status()["gcsfuse"]["path"])
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_mount_reaches_an_emulator_through_the_variable_google_cloud_storage_honours(gcsfuse_lab, lab_bucket,
                                                                                   tmp_path, monkeypatch):
    """As in the Colab rehearsal: no endpoint given, STORAGE_EMULATOR_HOST set; the mount reads the
    emulator's bytes, and a custom endpoint turns off the storage-layout probe emulators do not serve."""
    lab_bucket.blob("x/y.bin").upload_from_string(b"emulated" * 1000)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcsfuse_lab.endpoint)
    with mount_gcsfuse(lab_bucket.name, tmp_path / "mnt", anonymous=True,
                       gcsfuse=gcsfuse_lab.status()["gcsfuse"]["path"], timeout=60) as m:
        assert (m.mountpoint / "x" / "y.bin").read_bytes() == b"emulated" * 1000
        assert f"--custom-endpoint {gcsfuse_lab.endpoint}/storage/v1/" in " ".join(m.args)
        config = json.loads(Path(m.args[m.args.index("--config-file") + 1]).read_text())
        assert config["enable-hns"] is False


def _config(mount):
    return json.loads(Path(mount.args[mount.args.index("--config-file") + 1]).read_text())


def test_the_file_cache_is_bounded_by_the_free_disk_unless_told_otherwise(gcsfuse_lab, lab_bucket, tmp_path):
    """gcsfuse's own "unlimited" (-1) can fill a Colab runtime's disk: by default the cache is bounded to
    the free space of its disk less a reserve; -1 still works when asked for, with a warning."""
    lab_bucket.blob("z.bin").upload_from_string(b"z" * 1000)
    kwargs = {"endpoint": gcsfuse_lab.endpoint, "anonymous": True, "gcsfuse": gcsfuse_lab.status()["gcsfuse"]["path"]}
    usage = shutil.disk_usage(tmp_path)
    with mount_gcsfuse(lab_bucket.name, tmp_path / "a", cache_dir=tmp_path / "cache-a", **kwargs) as m:
        limit = _config(m)["file-cache"]["max-size-mb"]
        assert limit > 0 and abs(limit - file_cache_room_mb(usage)) < 64, "the default is the policy's room on this disk"
        assert (m.mountpoint / "z.bin").read_bytes() == b"z" * 1000
    with mount_gcsfuse(lab_bucket.name, tmp_path / "b", cache_dir=tmp_path / "cache-b", cache_max_mb=100, **kwargs) as m:
        assert _config(m)["file-cache"]["max-size-mb"] == 100
    with pytest.warns(UserWarning, match="can fill the disk"):
        with mount_gcsfuse(lab_bucket.name, tmp_path / "c", cache_dir=tmp_path / "cache-c", cache_max_mb=-1,
                           **kwargs) as m:
            assert _config(m)["file-cache"]["max-size-mb"] == -1
    with pytest.raises(MountError, match="free"):
        mount_gcsfuse(lab_bucket.name, tmp_path / "d", cache_dir=tmp_path / "cache-d",
                      cache_max_mb=usage.free // 2**20 + 10, **kwargs)


def test_a_default_file_cache_keeps_a_reserve_free_and_fits_a_big_disk_that_is_mostly_used():
    """What a default file cache may take: the free space less a reserve of a tenth of the disk, but
    never more than half of what is free, and at least 1 GiB. The first case is a CI machine's disk
    (252 GB, 24.9 GB free), where a reserve of a tenth of the disk refused every default file cache."""
    usage = type(shutil.disk_usage("/"))
    GiB, MiB = 1 << 30, 1 << 20
    assert file_cache_room_mb(usage(total=252 * GiB, used=227 * GiB, free=25 * GiB)) == 25 * GiB // 2 // MiB
    assert file_cache_room_mb(usage(total=107 * GiB, used=30 * GiB, free=77 * GiB)) == (77 * GiB - 107 * GiB // 10) // MiB
    assert file_cache_room_mb(usage(total=20 * GiB, used=18 * GiB, free=2 * GiB)) == GiB // MiB
    assert file_cache_room_mb(usage(total=20 * GiB, used=19 * GiB, free=GiB + 10 * MiB)) == 10
    assert file_cache_room_mb(usage(total=20 * GiB, used=19 * GiB + 512 * MiB, free=512 * MiB)) == 0


def test_a_lab_mount_takes_gcsfuse_knobs_read_only_and_one_folder(gcsfuse_lab, lab_bucket):
    lab_bucket.blob("data/a.bin").upload_from_string(b"a" * 100)
    lab_bucket.blob("other/b.bin").upload_from_string(b"b" * 100)
    with gcsfuse_lab.mount(lab_bucket.name, config={"only-dir": "data"}, extra_args=("-o", "ro")) as m:
        assert sorted(os.listdir(m.mountpoint)) == ["a.bin"], "only-dir shows just that folder"
        with pytest.raises(OSError, match="Read-only"):
            (m.mountpoint / "new.txt").write_text("x")
    assert lab_bucket.get_blob("new.txt") is None


def test_a_file_cache_of_the_mounts_own_is_used_and_goes_at_unmount(gcsfuse_lab, lab_bucket, tmp_path):
    """``file_cache=True`` with no folder named: the cache is real (a read fills it) and lives in a temp
    folder of the mount's own, which unmount removes (a lesson run again and again must not fill the disk)."""
    lab_bucket.blob("k/w.bin").upload_from_string(b"w" * 300_000)
    with mount_gcsfuse(lab_bucket.name, tmp_path / "mnt", file_cache=True, endpoint=gcsfuse_lab.endpoint,
                       anonymous=True, gcsfuse=gcsfuse_lab.status()["gcsfuse"]["path"]) as m:
        assert (m.mountpoint / "k" / "w.bin").read_bytes() == b"w" * 300_000
        cached = [p for p in m.cache_dir.rglob("*") if p.is_file()]
        assert [p.stat().st_size for p in cached] == [300_000], "the read went through the file cache"
    assert not m.cache_dir.exists() and not m.log_path.exists(), "unmount removed the mount's own folder"


def test_a_lab_mounts_file_cache_goes_at_unmount(gcsfuse_lab, lab_bucket):
    """The lab keeps a mount's file cache in its run folder; unmount removes it (lesson 02 mounts 15 times)."""
    lab_bucket.blob("c.bin").upload_from_string(b"c" * 200_000)
    m = gcsfuse_lab.mount(lab_bucket.name, file_cache=True)
    assert (m.mountpoint / "c.bin").read_bytes() == b"c" * 200_000
    assert [p.stat().st_size for p in m.cache_dir.rglob("*") if p.is_file()] == [200_000]
    m.unmount()
    assert not m.cache_dir.exists()


def test_a_folder_on_a_gcsfuse_mount_keeps_its_versions_and_cache_when_gcsfuse_renumbers_its_files(
        gcsfuse_lab, lab_bucket, tmp_path):
    """gcsfuse gives a file a new inode number each time the kernel looks it up afresh (after it forgot the
    inode under memory pressure, or after a remount), in the order files are looked up. A version with the
    inode number in it said every such file "changed since it was listed" mid-epoch, and keyed it anew in the
    cache, so the cache filled through a mount was never used again after a remount."""
    from dataferry import Cache, LocalSource

    names = [f"d/f{i}.bin" for i in range(4)]
    for i, name in enumerate(names):
        lab_bucket.blob(name).upload_from_string(bytes([i]) * (1000 + i))
    point = tmp_path / "mnt"
    source, cache = LocalSource(point), Cache(tmp_path / "cache")
    with gcsfuse_lab.mount(lab_bucket.name, mountpoint=point):
        listed = sorted(source.list(), key=lambda e: e.name)
        numbers = [os.stat(point / n).st_ino for n in names]
        assert [cache.read(source, e) for e in listed] == [bytes([i]) * (1000 + i) for i in range(4)]
    lab_bucket.blob(names[3]).upload_from_string(b"new" * 1000)  # and one object replaced meanwhile
    with gcsfuse_lab.mount(lab_bucket.name, mountpoint=point):
        for name in reversed(names):  # looked up in the other order: gcsfuse numbers them otherwise
            os.stat(point / name)
        assert [os.stat(point / n).st_ino for n in names] != numbers, "the premise: gcsfuse renumbered the files"
        for e in listed[:3]:  # a listing taken before the numbers changed still reads
            assert source.fetch(e, io.BytesIO()) == e.size
        with pytest.raises(ChangedAtSource):  # but not the object replaced since
            source.fetch(listed[3], io.BytesIO())
        again = sorted(source.list(), key=lambda e: e.name)
        assert again[:3] == listed[:3] and again[3].version != listed[3].version, "the same files, the same versions"
        assert [cache.contains(source, e) for e in again] == [True, True, True, False], \
            "the cache filled through the mount is used, and the replaced object is not taken for its old copy"
        assert cache.read(source, again[3]) == b"new" * 1000
