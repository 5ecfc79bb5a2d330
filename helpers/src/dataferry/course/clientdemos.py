"""Lesson 03's demonstrations: the Google Cloud CLI beside the client's parallel downloads and ``stage``, and
downloads under injected faults (lab only), each one call that says so when it cannot run here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataferry.course.lessonfiles import LessonFiles

__all__ = ["FLOOR", "Copies", "FaultRun", "copy_three_ways", "stage_under_faults"]

#: The CLI copying one object: its start-up and one request, the least any ``gcloud storage cp`` costs.
FLOOR = "gcloud storage cp, 1 object"


@dataclass
class Copies:
    """Each way's rows (``way``, ``seconds``, ``bytes``, ``MBps``), the CLI's one-object floor in seconds, or why
    the CLI could not run here (``rows`` None)."""

    rows: Any
    floor_s: float
    why_not: str = ""


def _cli_env(files: LessonFiles) -> tuple[str | None, dict[str, str] | None, str]:
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None, None, "gcloud is not on this machine's PATH: the CLI was not measured."
    if files.lab is not None:  # the lab's shaped endpoint, without credentials, with settings of its own
        return gcloud, {**os.environ, **files.lab.gcloud_env()}, ""
    signed_in = subprocess.run([gcloud, "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    if not signed_in:
        return None, None, ("gcloud storage cp needs a signed-in account: run google.colab.auth.authenticate_user() "
                            "(WHERE = \"mine\" does) and this cell again.")
    return gcloud, dict(os.environ), ""


def copy_three_ways(files: LessonFiles, repeats: int, seed: int = 0) -> Copies:
    """``gcloud storage cp``, ``transfer_manager`` (16 threads) and ``stage`` copy the same objects, each into
    an empty folder and every byte read once after, in turns (:func:`dataferry.harness.bench.interleave`, a first
    round of warm-up dropped); and the CLI copying one object, its floor."""
    from google.cloud.storage import transfer_manager

    from dataferry import Cache, GCSSource, stage
    from dataferry.harness.bench import interleave

    gcloud, env, why_not = _cli_env(files)
    if gcloud is None:
        return Copies(None, float("nan"), why_not)
    bucket = files.client.bucket(files.bucket)
    source = GCSSource(files.bucket, "", client=files.client)
    wanted = set(files.names)
    entries = [e for e in source.list() if e.name in wanted]

    def read_back(folder: Any) -> dict[str, int]:
        return {"bytes": sum(len(p.read_bytes()) for p in folder.rglob("*") if p.is_file())}

    def with_gcloud(turn: Any, names: list[str] = files.names) -> dict[str, int]:
        subprocess.run([gcloud, "storage", "cp", *(f"gs://{files.bucket}/{n}" for n in names), str(turn.folder)],
                       check=True, capture_output=True, timeout=1800, env=env)
        return read_back(turn.folder)

    def with_transfer_manager(turn: Any) -> dict[str, int]:
        transfer_manager.download_many_to_path(bucket, files.names, destination_directory=str(turn.folder),
                                               max_workers=16, worker_type=transfer_manager.THREAD,
                                               raise_exception=True)
        return read_back(turn.folder)

    def with_stage(turn: Any) -> dict[str, int]:
        cache = Cache(turn.folder / "cache")
        stage(source, cache, entries, progress=False)
        return {"bytes": sum(len(cache.read(source, e)) for e in entries)}

    ways = {"gcloud storage cp": with_gcloud, "transfer_manager (16 threads)": with_transfer_manager,
            "dataferry stage": with_stage, FLOOR: lambda turn: with_gcloud(turn, files.names[:1])}
    with files.network(), tempfile.TemporaryDirectory(prefix="copies-") as scratch:
        rows = interleave(ways, repeats, seed, warm_up=True, work_dir=scratch)
    rows["MBps"] = rows["bytes"] / rows["seconds"] / 1e6
    floor = float(rows[rows["way"] == FLOOR]["seconds"].median())
    return Copies(rows[rows["way"] != FLOOR].reset_index(drop=True), floor)


@dataclass
class FaultRun:
    """What ``stage`` did under faults: its report, the cache's counters, the media requests fake-gcs-server
    answered (by status), how many cached objects differ from the stored bytes, and ``verify()``'s report."""

    objects: int
    report: Any
    stats: Any
    served: dict[int, int]
    wrong: int
    verified: Any

    @property
    def requests(self) -> int:
        return sum(self.served.values())


def stage_under_faults(files: LessonFiles, toxicity: float, cut_after: int) -> FaultRun | None:
    """``stage`` every file into a fresh cache while the lab's proxy resets ``toxicity`` of new connections at once
    and cuts as many after ``cut_after`` bytes; the faults are removed after, whatever happens. None (said) off
    the lab, where faults cannot be injected."""
    from dataferry import Cache, GCSSource, stage

    lab = files.lab
    if lab is None:
        print("Faults can be injected only in the lab (toxiproxy sits between the client and the stand-in for Cloud "
              "Storage): skipped here.")
        return None
    source = GCSSource(files.bucket, "", client=lab.client())
    wanted = set(files.names)
    entries = [e for e in source.list() if e.name in wanted]  # listed before the faults
    before = len(lab.requests())
    toxics = [{"name": "l03-resets", "type": "reset_peer", "stream": "downstream", "toxicity": toxicity,
               "attributes": {"timeout": 0}},
              {"name": "l03-cutoff", "type": "limit_data", "stream": "downstream", "toxicity": toxicity,
               "attributes": {"bytes": cut_after}}]
    with tempfile.TemporaryDirectory(prefix="faults-") as folder:
        cache, added = Cache(folder), []
        try:
            for toxic in toxics:
                lab.toxiproxy.add_toxic("gcs", toxic)
                added.append(toxic["name"])
            with files.network():
                report = stage(source, cache, entries, progress=False)
        finally:
            for name in added:
                lab.toxiproxy.remove_toxic("gcs", name)
        served: dict[int, int] = {}
        for method, path, status in lab.requests()[before:]:
            if method == "GET" and "alt=media" in path:
                served[status] = served.get(status, 0) + 1
        direct = lab.client(direct=True).bucket(files.bucket)  # the stored bytes, past the proxy
        wrong = sum(cache.read(source, e) != direct.blob(e.name).download_as_bytes() for e in entries)
        return FaultRun(len(entries), report, cache.stats(), served, wrong, cache.verify())
