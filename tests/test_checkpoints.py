"""Checkpoints to a folder (local, a gcsfuse mount) and to a lab bucket: kept N, verified, and a process
killed in the middle of a save leaves the previous checkpoint the latest, whole."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dataferry.checkpoints import CheckpointError, Checkpoints


def _payload(step: int, size: int = 300_000) -> bytes:
    return bytes((step * 7 + i) % 251 for i in range(size))


def _save(ckpt: Checkpoints, step: int) -> None:
    ckpt.save(step, lambda path: path.write_bytes(_payload(step)))


@pytest.fixture(params=["folder", "gcsfuse-mount", "bucket"])
def dest(request, lab, lab_bucket, tmp_path):
    """A local folder, a folder on a mounted bucket (as Drive is a mounted folder; gcsfuse renames by copying,
    so nothing may rely on renaming), and the bucket itself."""
    if request.param == "folder":
        yield {"dest": str(tmp_path / "drive" / "ckpts")}
    elif request.param == "gcsfuse-mount":
        if not lab.status()["gcsfuse"]["available"]:
            pytest.skip("no gcsfuse in this lab")
        with lab.mount(lab_bucket.name) as m:
            yield {"dest": str(m.mountpoint / "ckpts")}
    else:
        yield {"dest": f"gs://{lab_bucket.name}/run1/ckpts", "client": lab.client(direct=True)}


def test_the_newest_checkpoints_are_kept_and_the_latest_comes_back_whole(dest, tmp_path):
    ckpt = Checkpoints(dest["dest"], keep=3, client=dest.get("client"), work=tmp_path / "work")
    assert ckpt.latest() is None
    with pytest.raises(CheckpointError, match="nothing to resume from"):
        ckpt.fetch()
    for step in (100, 200, 300, 400, 500):
        _save(ckpt, step)
    assert ckpt.names() == [f"checkpoint-{s:09d}.pt" for s in (300, 400, 500)]
    latest = ckpt.latest()
    assert latest.step == 500 and latest.bytes == 300_000
    assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(500)
    assert not list((tmp_path / "work").iterdir()), "each local write is removed once it is copied"


CHILD = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from dataferry.checkpoints import Checkpoints

    dest, where = sys.argv[1], sys.argv[2]
    client = None
    if dest.startswith("gs://"):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        client = storage.Client(project="lab", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": os.environ["STORAGE_EMULATOR_HOST"]})

    def die_half_way(src, dst, *a, **k):  # a disconnect in the middle of the copy
        data = Path(src).read_bytes()
        with open(dst, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def die_uploading(self, *a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "copy":
        shutil.copyfile = die_half_way
    else:
        from google.cloud.storage import Blob
        Blob.upload_from_filename = die_uploading
    Checkpoints(dest, keep=3, client=client).save(2, lambda p: p.write_bytes(bytes(range(256)) * 4000))
""")


def test_a_disconnect_in_the_middle_of_a_save_leaves_the_last_good_checkpoint(dest, lab, tmp_path):
    ckpt = Checkpoints(dest["dest"], keep=3, client=dest.get("client"), work=tmp_path / "work")
    _save(ckpt, 1)
    where = "upload" if dest["dest"].startswith("gs://") else "copy"
    proc = subprocess.run([sys.executable, "-c", CHILD, dest["dest"], where], env={**os.environ, **lab.env()},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    latest = ckpt.latest()
    assert latest.step == 1, "the pointer moves only after the new checkpoint is whole and verified"
    assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(1)
    assert ckpt.names() == ["checkpoint-000000001.pt"], "a torn copy is never listed as a checkpoint"
    _save(ckpt, 3)
    assert ckpt.latest().step == 3
    if not dest["dest"].startswith("gs://"):
        assert sorted(os.listdir(dest["dest"])) == ["checkpoint-000000001.pt", "checkpoint-000000001.pt.json",
                                                    "checkpoint-000000003.pt", "checkpoint-000000003.pt.json"], \
            "the next save clears the torn copy"


def test_a_checkpoint_changed_after_it_was_saved_is_refused(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=2, work=tmp_path / "work")
    _save(ckpt, 7)
    path = tmp_path / "ckpts" / "checkpoint-000000007.pt"
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the CRC32C"):
        ckpt.fetch()
    assert path.exists(), "nothing is deleted: the user decides"


def test_a_missing_bucket_is_a_clear_error(lab, tmp_path):
    ckpt = Checkpoints("gs://no-such-bucket-here/ckpts", client=lab.client(direct=True), work=tmp_path / "work")
    with pytest.raises(CheckpointError, match="does not exist"):
        _save(ckpt, 1)
    assert not list((tmp_path / "work").iterdir()), "nothing is left behind locally"


def test_a_record_torn_by_a_disconnect_does_not_count(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=2, work=tmp_path / "work")
    _save(ckpt, 1)
    _save(ckpt, 2)
    (tmp_path / "ckpts" / "checkpoint-000000002.pt.json").write_text('{"name": "checkpoint-0000')
    assert ckpt.latest().step == 1 and ckpt.fetch().read_bytes() == _payload(1)
