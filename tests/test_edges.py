"""The cache's promises at the edges: torn folder copies, odd names, overwrites between stat and
download, forks while a thread holds a lock, and the small things a user sees (issue: trust at the
edges). Real folders, real lab buckets, real forks; nothing is mocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dataferry import Cache, GCSSource, LocalSource, stage
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
        with cache._mutex:
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
    from dataferry.mounts import _config_text

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
    from dataferry.bench import _lab_environment

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

    class BadDisk:
        def write(self, data: bytes) -> int:
            raise OSError(5, "Input/output error")  # EIO from the cache's own disk

    t0 = time.monotonic()
    with pytest.raises(OSError, match="cache's disk"):
        cache._download(LocalSource(root), LocalSource(root).stat("a.bin"), BadDisk())
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
