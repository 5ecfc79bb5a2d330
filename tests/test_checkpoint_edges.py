"""Checkpoints at the edges: odd suffixes and records, what dead processes and odd ``write()``s leave, a full
destination, two savers on one destination, a damaged newest save. Nothing acknowledged is lost, nothing
is told it saved bytes it did not, and every failure is one CheckpointError line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dataferry.checkpoints import CheckpointError, Checkpoints, CheckpointWarning


def _payload(step: int, size: int = 300_000) -> bytes:
    return bytes((step * 7 + i) % 251 for i in range(size))


def _save(ckpt: Checkpoints, step: int, size: int = 300_000):
    return ckpt.save(step, lambda path: path.write_bytes(_payload(step, size)))


@pytest.fixture(params=["folder", "bucket"])
def dest(request, lab, lab_bucket, tmp_path):
    if request.param == "folder":
        yield {"dest": str(tmp_path / "ckpts")}
    else:
        yield {"dest": f"gs://{lab_bucket.name}/ckpts", "client": lab.client(direct=True), "bucket": lab_bucket}


def _names(d: dict) -> list[str]:
    if "bucket" in d:
        return sorted(b.name.removeprefix("ckpts/") for b in d["bucket"].client.list_blobs(d["bucket"].name,
                                                                                           prefix="ckpts/"))
    return sorted(os.listdir(d["dest"]))


def _write_record(d: dict, name: str, text: bytes) -> None:
    if "bucket" in d:
        d["bucket"].blob(f"ckpts/{name}").upload_from_string(text)
    else:
        (Path(d["dest"]) / name).write_bytes(text)


@pytest.mark.parametrize("suffix", [".json", ".pt.json", ".safetensors", ".1.pt"])
def test_any_suffix_keeps_its_saves(dest, tmp_path, suffix):
    """Pruning used to strip the record's suffix from a checkpoint named with '.json': it deleted every save
    right after acknowledging it."""
    ckpt = Checkpoints(dest["dest"], keep=2, client=dest.get("client"), suffix=suffix, work=tmp_path / "w")
    for step in (1, 2, 3):
        saved = _save(ckpt, step)
        assert ckpt.latest() == saved
    assert [s.step for s in ckpt.saved()] == [2, 3]
    assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(3)
    assert len(_names(dest)) == 4, _names(dest)


@pytest.mark.parametrize("bad", ["a/b", "", "x\0y"])
def test_a_suffix_or_name_that_cannot_name_a_file_is_refused(tmp_path, bad):
    from dataferry.errors import BadArgument

    with pytest.raises(BadArgument, match="suffix"):
        Checkpoints(tmp_path / "c", suffix=bad, work=tmp_path / "w")
    with pytest.raises(BadArgument, match="name"):
        Checkpoints(tmp_path / "c", name=f"ckpt{bad}" if bad else "", work=tmp_path / "w")
    assert not (tmp_path / "c").exists(), "nothing is made for a refused argument"


@pytest.mark.parametrize("change", ["an extra key", "a byte-order mark", "both"])
def test_a_record_with_an_extra_key_or_a_bom_still_counts_and_is_never_deleted(dest, tmp_path, change):
    """A record edited by a tool that adds a key or a UTF-8 byte-order mark is still a whole record: its
    checkpoint counts, and the next save keeps it (it was taken for a torn copy and deleted)."""
    ckpt = Checkpoints(dest["dest"], keep=3, client=dest.get("client"), work=tmp_path / "w")
    first = _save(ckpt, 1)
    record = json.loads(ckpt._get_text(first.name + ".json"))
    if change != "a byte-order mark":
        record["note"] = "added by hand"
    text = json.dumps(record).encode()
    if change != "an extra key":
        text = b"\xef\xbb\xbf" + text
    _write_record(dest, first.name + ".json", text)
    assert ckpt.latest().name == first.name
    _save(ckpt, 2)
    assert [s.step for s in ckpt.saved()] == [1, 2]
    assert first.name in _names(dest) and first.name + ".json" in _names(dest)
    Path(tmp_path / "back").mkdir()
    ckpt2 = Checkpoints(dest["dest"], keep=1, client=dest.get("client"), work=tmp_path / "w")
    _save(ckpt2, 3)  # now it is older than the one kept: it goes, as any old save
    assert [s.step for s in ckpt2.saved()] == [3]


def test_a_folder_left_in_the_work_folder_by_a_dead_process_is_cleared(tmp_path):
    work = tmp_path / "w"
    left = work / ".dataferry-checkpoint-999999999-abc.pt"  # a pid no process has
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "weights.bin").write_bytes(b"x" * 1000)
    ckpt = Checkpoints(tmp_path / "ckpts", work=work)
    assert not left.exists()
    _save(ckpt, 1)


def test_a_write_that_makes_its_path_a_folder_is_one_clear_line_and_leaves_nothing(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=2, work=tmp_path / "w")
    _save(ckpt, 1)

    def save_pretrained(path):  # as transformers' save_pretrained(path) does
        path.unlink()
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"weights")

    with pytest.raises(CheckpointError, match="folder.*one file"):
        ckpt.save(2, save_pretrained)
    assert not list((tmp_path / "w").iterdir()), "its folder is removed"
    assert [s.step for s in ckpt.saved()] == [1]
    Checkpoints(tmp_path / "ckpts", work=tmp_path / "w")


@pytest.mark.parametrize("write", ["ignores its path", "writes elsewhere"])
def test_a_write_that_leaves_its_file_empty_is_refused_and_prunes_nothing(tmp_path, write):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=1, work=tmp_path / "w")
    _save(ckpt, 1)
    with pytest.raises(CheckpointError, match="wrote nothing"):
        ckpt.save(2, (lambda p: None) if write == "ignores its path" else
                  (lambda p: (tmp_path / "elsewhere.pt").write_bytes(b"x")))
    assert [s.step for s in ckpt.saved()] == [1] and ckpt.fetch(tmp_path / "b").read_bytes() == _payload(1)
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["checkpoint-000000001.pt", "checkpoint-000000001.pt.json"]


def test_keep_counts_only_whole_checkpoints(dest, tmp_path):
    """A kept checkpoint damaged since (cut short in a folder; other bytes in a bucket, whose listing gives its
    CRC32C) does not count towards ``keep``: the whole one before it stays."""
    ckpt = Checkpoints(dest["dest"], keep=2, client=dest.get("client"), work=tmp_path / "w")
    for step in (1, 2):
        _save(ckpt, step)
    damaged = ckpt.saved()[-1].name
    if "bucket" in dest:
        dest["bucket"].blob(f"ckpts/{damaged}").upload_from_string(_payload(99))  # same size, other bytes
    else:
        path = Path(dest["dest"]) / damaged
        path.write_bytes(path.read_bytes()[:1000])
    _save(ckpt, 3)
    assert {s.step for s in ckpt.saved()} >= {1, 3}, "1 stays: 2 is damaged and does not count"
    (Path(dest["dest"]) / ckpt.saved()[-1].name).unlink() if "bucket" not in dest else \
        dest["bucket"].blob(f"ckpts/{ckpt.saved()[-1].name}").delete()
    with pytest.warns(CheckpointWarning, match="missing.*damaged|missing"):
        assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(1), "the whole one kept is what comes back"


@contextlib.contextmanager
def _small_disk(path: Path, size: str):
    """A real file system of ``size`` (tmpfs), so that a destination really fills up."""
    path.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root needed): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_destination_makes_room_from_saves_beyond_keep_and_leaves_nothing_torn(tmp_path):
    with _small_disk(tmp_path / "drive", "1100k") as drive:
        ckpt = Checkpoints(drive / "ckpts", keep=3, work=tmp_path / "w")
        for step in (1, 2, 3):
            _save(ckpt, step)  # 900 KB of 1100 KB
        _save(ckpt, 4)  # does not fit beside three: the oldest of the three makes room, as keep=3 asks
        assert [s.step for s in ckpt.saved()] == [2, 3, 4]
        for _ in range(3):
            with pytest.raises(CheckpointError, match="full"):
                _save(ckpt, 5, size=2_000_000)  # can never fit
        assert sorted(os.listdir(drive / "ckpts")) == sorted(
            f"checkpoint-{s:09d}.pt{r}" for s in (2, 3, 4) for r in ("", ".json")), "no failed copy stays"
        assert [s.step for s in ckpt.saved()] == [2, 3, 4], "a save that cannot fit deletes nothing"
        _save(ckpt, 5)
        assert [s.step for s in ckpt.saved()] == [3, 4, 5]


def test_fetch_into_a_full_folder_blames_the_local_disk_not_the_destination(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpts", work=tmp_path / "w")
    _save(ckpt, 1)
    with _small_disk(tmp_path / "small", "100k") as small:
        with pytest.raises(CheckpointError) as caught:
            ckpt.fetch(small)
        assert "local" in str(caught.value) and "Drive" not in str(caught.value), caught.value
        assert not list(small.iterdir())


def test_two_savers_on_one_destination_never_share_a_name(dest, tmp_path):
    """Two notebooks saving the same steps to one folder or prefix: every acknowledged save has a name of its
    own, holding the bytes it was told it holds."""
    acknowledged: list = []
    errors: list = []

    def saver(who: int) -> None:
        ckpt = Checkpoints(dest["dest"], keep=1000, client=dest.get("client"), work=tmp_path / f"w{who}")
        deadline = time.monotonic() + 6
        step = 0
        while time.monotonic() < deadline:
            body = b"%d:%d:" % (who, step) + os.urandom(2000)
            try:
                saved = ckpt.save(step, lambda p: p.write_bytes(body))
            except CheckpointError as e:
                errors.append(e)
                continue
            acknowledged.append((saved, body))
            step += 1

    threads = [threading.Thread(target=saver, args=(who,)) for who in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [s.name for s, _ in acknowledged]
    assert len(acknowledged) > 10 and len(set(names)) == len(names), "a name was acknowledged twice"
    reader = Checkpoints(dest["dest"], keep=1000, client=dest.get("client"), work=tmp_path / "r")
    recorded = {s.name: s for s in reader.saved()}
    for saved, body in acknowledged:
        assert recorded[saved.name].crc32c == saved.crc32c
        got = (reader._fetch_one(saved, tmp_path / "r"), (tmp_path / "r" / saved.name).read_bytes())
        assert got == (None, body), saved.name
