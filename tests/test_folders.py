"""Reading a folder as the lessons measure it: listings, whole-file passes, an archive copied and extracted,
a value sampled while a block runs. Real files on this machine's disk (a mount behaves the same way and is
exercised by the lessons against the lab)."""

import io
import tarfile
import time
import zipfile

import pytest

from dataferry.errors import BadArgument
from dataferry.harness.folders import LISTINGS, copy_extract_read, extract, read_files, sample_every, timed_listing, walk


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "data"
    for i in range(12):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 3}" / f"{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    return root


def test_walk_finds_every_file_below_and_no_folder(folder):
    found = walk(folder)
    assert sorted(found) == sorted(str(p) for p in folder.rglob("*.bin")) and len(found) == 12


@pytest.mark.parametrize("way", list(LISTINGS))
def test_both_listings_count_the_files_of_a_folder_not_its_folders(folder, way):
    (folder / "c0" / "sub").mkdir()
    n, ns = timed_listing(folder / "c0", way)
    assert n == 4 and ns > 0
    with pytest.raises(BadArgument, match="os.scandir"):
        timed_listing(folder, "ls -l")


@pytest.mark.parametrize("width", [1, 4])
def test_a_read_pass_returns_every_byte_and_its_wall_time(folder, width):
    paths = walk(folder)
    t0 = time.perf_counter()
    done = read_files(paths, width)
    assert done.files == 12 and done.bytes == sum(1000 + i for i in range(12))
    assert 0 < done.seconds <= time.perf_counter() - t0 and done.MBps == pytest.approx(done.bytes / done.seconds / 1e6)
    assert "12 files" in repr(done)
    with pytest.raises(BadArgument):
        read_files(paths, 0)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_an_archive_copied_extracted_and_read_gives_back_every_file(folder, tmp_path, kind):
    archive = tmp_path / f"data.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as z:
            for p in folder.rglob("*.bin"):
                z.write(p, p.relative_to(folder))
    else:
        with tarfile.open(archive, "w") as t:
            t.add(folder, ".")
    work = tmp_path / "work"
    work.mkdir()
    row = copy_extract_read(archive, work)
    got = {p.relative_to(work / "data"): p.read_bytes() for p in (work / "data").rglob("*.bin")}
    assert got == {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*.bin")}
    assert min(row["copy_s"], row["extract_s"], row["read_s"]) > 0
    assert row["copy_bytes"] == archive.stat().st_size
    assert row["local_bytes"] == archive.stat().st_size + sum(len(b) for b in got.values())
    assert row["read_cache_state"] == "cold_verified", "the read step reads the disk: extraction's pages were dropped"


def test_an_archive_member_that_would_land_outside_the_folder_is_refused(tmp_path):
    """Bad input loses nothing: a name that climbs out of the folder is not written anywhere."""
    evil_zip = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil_zip, "w") as z:
        z.writestr("../escaped.txt", "x")
    with pytest.raises(BadArgument, match="outside"):
        extract(evil_zip, tmp_path / "into")
    evil_tar = tmp_path / "evil.tar"
    with tarfile.open(evil_tar, "w") as t:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(BadArgument, match="not extracted"):
        extract(evil_tar, tmp_path / "into")
    assert not (tmp_path / "escaped.txt").exists()


def test_a_value_is_sampled_while_the_block_runs_and_once_at_its_end():
    value = [0]
    with sample_every(0.005, lambda: value[0]) as samples:
        for v in range(1, 6):
            time.sleep(0.02)
            value[0] = v
    times = [t for t, _ in samples]
    assert len(samples) >= 5 and times == sorted(times)
    assert samples[0][1] == 0 and samples[-1][1] == 5, "the first sample is at the start, the last at the end"
    assert {v for _, v in samples} >= {0, 5}


def test_bad_input_to_the_archive_helpers_is_a_clear_error_that_writes_nothing(folder, tmp_path):
    work = tmp_path / "work"
    with pytest.raises(BadArgument, match="no such archive"):
        copy_extract_read(tmp_path / "missing.zip", tmp_path)
    (tmp_path / "data.7z").write_bytes(b"7z")
    with pytest.raises(BadArgument, match="not a .zip or a tar"):
        extract(tmp_path / "data.7z", work)
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as z:
        z.writestr("a.bin", "a")
    with pytest.raises(BadArgument, match="not a folder"):
        copy_extract_read(tmp_path / "data.zip", work)
    with pytest.raises(BadArgument, match="already in"):
        copy_extract_read(tmp_path / "data.zip", tmp_path)
    assert not work.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["data", "data.7z", "data.zip"]
    with pytest.raises(BadArgument, match="positive interval"):
        with sample_every(0, lambda: 1):
            pass
