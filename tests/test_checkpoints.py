"""Checkpoints to a folder (local, a gcsfuse mount) and to a lab bucket: kept N, verified, and a process
killed in the middle of a save leaves the previous checkpoint the latest, whole."""

import base64
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from dataferry.checkpoints import CheckpointError, Checkpoints, CheckpointWarning


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

    dest, where, work = sys.argv[1], sys.argv[2], sys.argv[3]
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
    Checkpoints(dest, keep=3, client=client, work=work).save(2, lambda p: p.write_bytes(bytes(range(256)) * 4000))
""")


def test_a_disconnect_in_the_middle_of_a_save_leaves_the_last_good_checkpoint(dest, lab, tmp_path):
    ckpt = Checkpoints(dest["dest"], keep=3, client=dest.get("client"), work=tmp_path / "work")
    _save(ckpt, 1)
    where = "upload" if dest["dest"].startswith("gs://") else "copy"
    child_work = tmp_path / "child-work"
    proc = subprocess.run([sys.executable, "-c", CHILD, dest["dest"], where, str(child_work)],
                          env={**os.environ, **lab.env()}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [p.name.startswith(".dataferry-checkpoint-") for p in child_work.iterdir()] == [True], \
        "the killed save left its local copy"
    Checkpoints(dest["dest"], keep=3, client=dest.get("client"), work=child_work)
    assert not list(child_work.iterdir()), "the next open in that work folder removes a dead process's copy"
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


# -- nothing acknowledged is ever lost: re-saves, saves below the newest, kills at each point --------

KILL_AT = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    import dataferry.checkpoints as ck

    dest, work, step, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def half_copy(src, dst, *a, **k):  # a disconnect in the middle of the copy to the destination
        data = Path(src).read_bytes()
        with open(dst, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
        die()

    real_put = ck.Checkpoints._put_text
    def half_record(self, name, text):  # a disconnect in the middle of writing the record
        real_put(self, name, text[: len(text) // 2])
        die()

    def writing(path):  # a kill while the training loop writes the checkpoint locally
        Path(path).write_bytes(b"x" * 100_000)
        die()

    if kill_at == "copy":
        shutil.copyfile = half_copy
    elif kill_at == "record":
        ck.Checkpoints._put_text = half_record
    ck.Checkpoints(dest, keep=3, work=work).save(step, writing if kill_at == "write" else
                                                 lambda p: Path(p).write_bytes(b"killed save %d" % step))
""")


def _kill_during_save(dest, work, step: int, kill_at: str) -> None:
    proc = subprocess.run([sys.executable, "-c", KILL_AT, str(dest), str(work), str(step), kill_at],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.mark.parametrize("kill_at", ["copy", "record"])
def test_a_kill_while_saving_a_recorded_step_again_keeps_the_acknowledged_save(tmp_path, kill_at):
    """A resumed loop saves again at the step it resumed from: the saved one is never written over."""
    ckpt = Checkpoints(tmp_path / "ckpts", keep=3, work=tmp_path / "work")
    _save(ckpt, 1)
    _save(ckpt, 2)
    _kill_during_save(tmp_path / "ckpts", tmp_path / "work", 2, kill_at)
    assert ckpt.latest().step == 2, "latest() never goes back past an acknowledged save"
    assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(2), "the acknowledged save comes back whole"
    again = ckpt.save(2, lambda p: p.write_bytes(b"second save of step 2"))
    assert ckpt.latest() == again and ckpt.fetch(tmp_path / "back").read_bytes() == b"second save of step 2"


def test_saving_below_the_newest_step_makes_that_save_the_latest(tmp_path):
    """Restarting from an older checkpoint: the new save is what a later resume gets, not the old run's newer step."""
    ckpt = Checkpoints(tmp_path / "ckpts", keep=3, work=tmp_path / "work")
    for step in (100, 200, 300, 400, 500):
        _save(ckpt, step)
    saved = ckpt.save(200, lambda p: p.write_bytes(b"step 200, second run"))
    assert (tmp_path / "ckpts" / saved.name).read_bytes() == b"step 200, second run", "the save is not pruned"
    assert ckpt.latest() == saved
    assert ckpt.fetch(tmp_path / "back").read_bytes() == b"step 200, second run"
    assert len(ckpt.saved()) == 3, "keep counts the newest saves"


def test_no_temporary_copy_outlives_a_kill_once_checkpoints_opens_the_work_folder_again(tmp_path):
    work = tmp_path / "work"
    _save(Checkpoints(tmp_path / "ckpts", work=work), 1)
    for step, kill_at in ((2, "write"), (3, "copy"), (4, "write")):
        _kill_during_save(tmp_path / "ckpts", work, step, kill_at)
    assert list(work.iterdir()), "each kill left its local copy behind"
    ckpt = Checkpoints(tmp_path / "ckpts", work=work)
    assert not list(work.iterdir()), "opening the work folder again removes what killed saves left"
    assert ckpt.latest().step == 1


def test_a_copy_in_progress_in_another_process_is_not_removed(tmp_path):
    """Opening the work folder removes only what no live save holds."""
    work = tmp_path / "work"
    ckpt = Checkpoints(tmp_path / "ckpts", work=work)
    seen = []

    def write(path):
        path.write_bytes(b"in progress")
        Checkpoints(tmp_path / "ckpts", work=work)  # another Checkpoints opens the same work folder meanwhile
        seen.append(path.exists())

    ckpt.save(1, write)
    assert seen == [True]
    assert ckpt.fetch(tmp_path / "back").read_bytes() == b"in progress"


def _record(tmp_path, step: int) -> Path:
    return tmp_path / "ckpts" / f"checkpoint-{step:09d}.pt.json"


@pytest.mark.parametrize("bad", ["escaping name", "step a string", "a directory", "bytes a float", "not json"])
def test_a_record_that_is_not_one_of_ours_does_not_count(tmp_path, bad):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=3, work=tmp_path / "work")
    _save(ckpt, 1)
    _save(ckpt, 2)
    record = _record(tmp_path, 2)
    fields = json.loads(record.read_text())
    outside = tmp_path / "outside.pt"  # whole and matching its record: only the name check refuses it
    outside.write_bytes(b"not a checkpoint")
    import google_crc32c

    outside_crc = base64.b64encode(google_crc32c.value(outside.read_bytes()).to_bytes(4, "big")).decode()
    if bad == "a directory":
        record.unlink()
        record.mkdir()
    elif bad == "not json":
        record.write_bytes(b"\xff\x00garbage")
    else:
        fields.update({"escaping name": {"name": "../outside.pt", "bytes": 16, "crc32c": outside_crc},
                       "step a string": {"step": "2"},
                       "bytes a float": {"bytes": 1.5}}[bad])
        record.write_text(json.dumps(fields))
    assert ckpt.latest().step == 1
    assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(1)


def test_two_names_in_one_folder_never_mix(tmp_path):
    """'ckpt' and 'ckpt-ema' share a prefix: neither lists, fetches or prunes the other's checkpoints."""
    model = Checkpoints(tmp_path / "ckpts", keep=1, name="ckpt", work=tmp_path / "work")
    ema = Checkpoints(tmp_path / "ckpts", keep=1, name="ckpt-ema", work=tmp_path / "work")
    ema.save(1, lambda p: p.write_bytes(b"ema 1"))
    model.save(1, lambda p: p.write_bytes(b"model 1"))
    model.save(2, lambda p: p.write_bytes(b"model 2"))
    assert model.names() == ["ckpt-000000002.pt"] and ema.names() == ["ckpt-ema-000000001.pt"]
    assert ema.fetch(tmp_path / "back").read_bytes() == b"ema 1"


def test_fetch_falls_back_to_the_newest_good_checkpoint(tmp_path):
    ckpt = Checkpoints(tmp_path / "ckpts", keep=3, work=tmp_path / "work")
    for step in (1, 2, 3):
        _save(ckpt, step)
    path = tmp_path / "ckpts" / "checkpoint-000000003.pt"
    path.write_bytes(path.read_bytes()[:1000])  # truncated after it was saved
    (tmp_path / "ckpts" / "checkpoint-000000002.pt").unlink()  # deleted by hand
    with pytest.warns(CheckpointWarning, match=r"checkpoint-000000003\.pt.*CRC32C.*checkpoint-000000002\.pt.*missing"):
        back = ckpt.fetch(tmp_path / "back")
    assert back.read_bytes() == _payload(1)
    assert not [p for p in (tmp_path / "back").iterdir() if p != back], "a refused copy is not left behind"
    (tmp_path / "ckpts" / "checkpoint-000000001.pt").unlink()
    with pytest.raises(CheckpointError, match="no checkpoint in .* is whole"):
        ckpt.fetch(tmp_path / "back")


def test_latest_and_fetch_on_a_missing_bucket_are_clear_errors(lab, tmp_path):
    ckpt = Checkpoints("gs://no-such-bucket-here/ckpts", client=lab.client(direct=True), work=tmp_path / "work")
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.latest()
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.fetch()


def test_a_bucket_that_cannot_be_reached_is_a_clear_error_within_the_timeout(tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with socket.socket() as s:  # a port nothing listens on: a dead endpoint
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = storage.Client(project="lab", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": f"http://127.0.0.1:{port}"})
    ckpt = Checkpoints("gs://no-such-endpoint/ckpts", client=client, work=tmp_path / "work", timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="could not reach"):
        ckpt.latest()
    assert time.monotonic() - t0 < 30


def test_a_checkpoint_deleted_from_a_bucket_falls_back(lab, lab_bucket, tmp_path):
    ckpt = Checkpoints(f"gs://{lab_bucket.name}/ckpts", client=lab.client(direct=True), work=tmp_path / "work")
    _save(ckpt, 1)
    _save(ckpt, 2)
    lab.client(direct=True).bucket(lab_bucket.name).blob("ckpts/checkpoint-000000002.pt").delete()
    with pytest.warns(CheckpointWarning, match="missing"):
        assert ckpt.fetch(tmp_path / "back").read_bytes() == _payload(1)


SAVER = textwrap.dedent("""
    import random, sys
    from pathlib import Path
    from dataferry.checkpoints import Checkpoints

    dest, work, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    ckpt = Checkpoints(dest, keep=3, work=work)
    latest = ckpt.latest()
    step = latest.step if latest else 0
    print("ready", flush=True)
    while True:
        step = rng.choice([step, step + 1, step + 1, max(0, step - 2)])  # re-saves and saves below the newest too
        body = b"%d:" % step + rng.randbytes(rng.randrange(1, 400_000))
        saved = ckpt.save(step, lambda p: Path(p).write_bytes(body))
        print(saved.name, saved.serial, saved.crc32c, flush=True)  # acknowledged
""")


def test_random_kills_during_saves_never_lose_an_acknowledged_checkpoint(tmp_path):
    """SIGKILLs at random moments of a loop that saves, re-saves a step and saves below the newest:
    every acknowledged save stays recorded and whole, latest() never goes back past one, fetch()
    needs no fallback, and no local copy outlives the next Checkpoints(...)."""
    import google_crc32c

    dest, work = tmp_path / "ckpts", tmp_path / "work"
    rng = random.Random(20261124)
    acknowledged = None
    for seed in range(20):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(dest), str(work), str(seed)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        lines = out.split("\n")
        if len(lines) > 1:
            name, serial, crc = lines[-2].split()
            acknowledged = (name, int(serial), crc)
        ckpt = Checkpoints(dest, keep=3, work=work)
        assert not list(work.iterdir()), "no temporary copy survives the next Checkpoints(...)"
        if acknowledged is None:
            continue
        saved = {s.name: s for s in ckpt.saved()}
        name, serial, crc = acknowledged
        assert name in saved and (saved[name].serial, saved[name].crc32c) == (serial, crc), \
            f"the acknowledged save {name} was lost"
        latest = ckpt.latest()
        assert latest.serial >= serial, f"latest() {latest.name} went back past the acknowledged {name}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing recorded is damaged: fetch needs no fallback
            data = ckpt.fetch(tmp_path / "back").read_bytes()
        assert base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode() == latest.crc32c
        assert data.startswith(b"%d:" % latest.step)
    assert acknowledged is not None
