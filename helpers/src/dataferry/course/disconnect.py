"""Lesson 10's staged failures: a save killed half-way, as a kernel crash and as a disconnect do it.

A kernel crash (out of memory, a restart) kills the writing process; the runtime and its mount daemons
(Drive's, gcsfuse's) live on, and the kernel closes the half-written file for the dead writer, so a
daemon uploads what it was given. A disconnect takes the whole runtime: the writer and every daemon go
together, and a GCS object is replaced only when its upload completes, so an unfinished upload changes
nothing. Each is staged in a child process that writes half of a new checkpoint, then dies (after
killing the mount's daemon, for a disconnect). The disconnect can be staged only on a mount the lab runs:
Drive's daemon cannot be killed from a notebook, and a disconnect deletes the runtime's own disk.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataferry.course.lessondata import CheckpointPlaces

__all__ = ["CRASH", "DISCONNECT", "stage_failures"]

CRASH = "kernel crash (the writer dies)"
DISCONNECT = "disconnect (the writer and the mount's daemon die)"

_CHILD = """
import os, shutil, signal, sys
from pathlib import Path

way, target, new, daemon = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])

def die_half_way(src, dst, *args, **kwargs):
    data = Path(src).read_bytes()
    with open(dst, "wb") as f:  # as torch.save does: the file is emptied, then written
        f.write(data[: len(data) // 2])
        f.flush()
        if daemon:
            os.kill(daemon, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

if way == "torch.save":
    die_half_way(new, target)
else:
    from dataferry import Checkpoints
    from dataferry.checkpoints import destinations

    destinations.shutil.copyfile = die_half_way  # the copy to the destination is where it strikes
    Checkpoints(target, keep=3, work=str(new.parent / "work")).save(2, lambda p: p.write_bytes(new.read_bytes()))
"""


def _outcome(way: str, target: Path, before: bytes, work: Path) -> str:
    """What a restarted notebook would find at ``target`` after the failure."""
    import torch

    if way == "torch.save":
        if not target.exists():
            return "no checkpoint at all"
        try:
            torch.load(target, weights_only=True)
        except Exception as e:  # noqa: BLE001 - what a learner would see
            return f"the only checkpoint is torn (torch.load raised {type(e).__name__})"
        return "the previous checkpoint, whole (the new one is lost)" if target.read_bytes() == before else \
            "a checkpoint that is neither the old nor the new"
    from dataferry import Checkpoints

    latest = Checkpoints(target, keep=3).latest()
    if latest is None:
        return "no checkpoint recorded"
    state = torch.load(Checkpoints(target, keep=3).fetch(to=work), weights_only=True)
    return f"the newest recorded checkpoint (step {latest.step}), whole" if state.get("step") == latest.step else \
        f"a wrong checkpoint (step {state.get('step')}) for step {latest.step}"


def stage_failures(places: CheckpointPlaces, work: Path) -> list[dict[str, Any]]:
    """Each way of saving into each folder of ``places``, killed half-way by each failure that can be staged
    there: rows of (place, way, failure, what a restart finds). ``work`` holds the checkpoints' bytes."""
    import torch

    rows: list[dict[str, Any]] = []
    old, new = work / "old.pt", work / "new.pt"
    torch.save({"step": 1, "weights": torch.zeros(1 << 18)}, old)
    torch.save({"step": 2, "weights": torch.ones(1 << 18)}, new)
    for place in list(places.folders):
        mount = places.mounts.get(place)
        for failure in (CRASH, DISCONNECT) if mount is not None else (CRASH,):
            for way in ("torch.save", "Checkpoints"):
                folder = places.folders[place] / f"failure-{len(rows)}"
                folder.mkdir(parents=True)
                target = folder / "ckpt.pt" if way == "torch.save" else folder
                if way == "torch.save":
                    target.write_bytes(old.read_bytes())  # the checkpoint of the step before
                else:
                    from dataferry import Checkpoints

                    Checkpoints(folder, keep=3, work=work / "work").save(1, lambda p: p.write_bytes(old.read_bytes()))
                daemon = mount.pid if mount is not None and failure == DISCONNECT else 0
                subprocess.run([sys.executable, "-c", _CHILD, way, str(target), str(new), str(daemon)],
                               capture_output=True, timeout=300)
                if daemon:  # the runtime comes back: mount again, and look
                    mount = _remount(places, place, mount)
                    target = places.folders[place] / folder.name / target.relative_to(folder)
                rows.append({"place": place, "way": way, "failure": failure,
                             "a restart finds": _outcome(way, target, old.read_bytes(), work)})
    return rows


def _remount(places: CheckpointPlaces, place: str, dead: Any) -> Any:
    """A new mount of the bucket whose daemon was killed; ``places`` points at it from now on."""
    relative = places.folders[place].relative_to(dead.mountpoint)
    dead.unmount()
    mount = places.lab.mount(dead.bucket)
    places.mounts[place], places.folders[place] = mount, mount.mountpoint / relative
    return mount
