"""First epochs side by side: dataferry against what a user would pick instead, in the lab.

Every method starts cold in a fresh process (an empty destination, a fresh gcsfuse mount with an
empty file cache), lists the objects, gets every byte to local disk and reads every byte once:
that is one first epoch. Methods are interleaved within each repetition, so drift on a shared
2-core machine hits them all. Figures are ``lab:<profile>`` numbers, never cloud numbers.

The child side (``python -m benchmarks.peers METHOD ...``) prints one JSON line: seconds,
bytes, files, the peak RSS and CPU seconds of the process, and the busy CPU seconds of the whole
machine over the same span: the lab's servers share its cores, so a machine busy all the time
says the lab's CPU, not the method, set the pace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dataferry.harness.pagecache import drop_caches

__all__ = ["PEERS", "DATAFERRY", "DISK", "WIDTH", "first_epochs", "per_round", "ratios"]

WIDTH = 32  # the reader width every pooled method gets (dataferry's default staging width)
PEERS = ("gcsfs-get", "transfer-manager-threads", "gcsfuse-file-cache")
DATAFERRY = ("dataferry-stage", "dataferry-first-read")
#: Not a method: this disk's limit for a cache that keeps its copies across a crash. The same bytes, already in
#: memory, written to new files, made durable (one syncfs, as the cache makes a group durable) and read once.
DISK = "local-durable-write"


def _read_all(paths: list[str]) -> int:
    def one(path: str) -> int:
        with open(path, "rb") as f:
            return len(f.read())

    with ThreadPoolExecutor(WIDTH) as pool:
        return sum(pool.map(one, paths))


def _files(folder: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]


def _gcsfs_get(bucket: str, prefix: str, work: str) -> Callable[[], tuple[int, int]]:
    from gcsfs.core import GCSFileSystem  # the classic class, as Colab has it (newer ones probe gRPC first)

    fs = GCSFileSystem(endpoint_url=os.environ["STORAGE_EMULATOR_HOST"], token="anon")

    def epoch() -> tuple[int, int]:
        fs.get(f"{bucket}/{prefix}", work + "/", recursive=True)
        paths = _files(work)
        return len(paths), _read_all(paths)

    return epoch


def _transfer_manager(bucket: str, prefix: str, work: str) -> Callable[[], tuple[int, int]]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager

    client = storage.Client(project="dataferry-lab", credentials=AnonymousCredentials())

    def epoch() -> tuple[int, int]:
        names = [b.name for b in client.list_blobs(bucket, prefix=prefix)]
        for result in transfer_manager.download_many_to_path(
                client.bucket(bucket), names, destination_directory=work, max_workers=WIDTH,
                worker_type=transfer_manager.THREAD, raise_exception=True):
            if result is not None:
                raise result
        paths = [os.path.join(work, n) for n in names]
        return len(paths), _read_all(paths)

    return epoch


def _gcsfuse_read(mount: str, prefix: str) -> Callable[[], tuple[int, int]]:
    def epoch() -> tuple[int, int]:
        paths = _files(os.path.join(mount, prefix))
        return len(paths), _read_all(paths)

    return epoch


def _dataferry(bucket: str, prefix: str, work: str, how: str) -> Callable[[], tuple[int, int]]:
    import aiohttp  # noqa: F401 - imported before the span, as every method's modules are
    from google.cloud import storage  # noqa: F401

    from dataferry import Cache, GCSSource, Prefetcher, stage

    def epoch() -> tuple[int, int]:
        source, cache = GCSSource(bucket, prefix), Cache(work, min_free_bytes=0)
        entries = list(source.list())
        if how == "stage":
            report = stage(source, cache, entries, progress=False)
            if report.failures:
                raise RuntimeError(str(report))
            return len(entries), sum(len(cache.read(source, e)) for e in entries)
        n = 0
        with Prefetcher(source, cache, entries) as ahead:  # what CachedDataset.prefetching does
            for i, e in enumerate(entries):
                ahead.advance(i)
                n += len(cache.read(source, e))
        return len(entries), n

    return epoch


def _durable_write(bucket: str, prefix: str, work: str) -> Callable[[], tuple[int, int]]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from dataferry.cache.placing import syncfs

    client = storage.Client(project="dataferry-lab", credentials=AnonymousCredentials())
    sizes = [b.size for b in client.list_blobs(bucket, prefix=prefix)]
    data = os.urandom(max(sizes, default=0))

    def write(i: int) -> None:
        with open(os.path.join(work, f"{i:06d}"), "wb") as f:
            f.write(memoryview(data)[:sizes[i]])

    def epoch() -> tuple[int, int]:
        with ThreadPoolExecutor(WIDTH) as pool:
            list(pool.map(write, range(len(sizes))))
        syncfs(work)
        paths = _files(work)
        return len(paths), _read_all(paths)

    return epoch


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _child(method: str, bucket: str, prefix: str, work: str) -> dict[str, Any]:
    """One first epoch; the method's modules are imported and its client made before the span
    (warm-up outside the measured set), every connection is opened inside it."""
    if method == "gcsfs-get":
        epoch = _gcsfs_get(bucket, prefix, work)
    elif method == "transfer-manager-threads":
        epoch = _transfer_manager(bucket, prefix, work)
    elif method == "gcsfuse-file-cache":
        epoch = _gcsfuse_read(work, prefix)
    elif method == DISK:
        epoch = _durable_write(bucket, prefix, work)
    else:
        epoch = _dataferry(bucket, prefix, work, method.removeprefix("dataferry-"))
    t0, cpu0, busy0 = time.perf_counter(), os.times(), _machine_busy_s()
    files, n = epoch()
    seconds, cpu1, busy1 = time.perf_counter() - t0, os.times(), _machine_busy_s()
    # VmHWM, not ru_maxrss: the latter keeps the parent's size from before exec.
    found = re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())
    hwm = int(found[1]) if found else 0
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"seconds": seconds, "bytes": n, "files": files, "peak_rss_mib": hwm / 1024, "cpu_s": cpu_s,
            "machine_cpu_s": busy1 - busy0}


def first_epoch(lab: Any, method: str, bucket: str, prefix: str, work: Path) -> dict[str, Any]:
    """One cold first epoch of ``method`` in a fresh process; the mount (gcsfuse) is made outside the span."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    mount = lab.mount(bucket, file_cache=True) if method == "gcsfuse-file-cache" else None
    try:
        where = str(mount.mountpoint) if mount else str(work)
        dropped = drop_caches(3)  # the last method's writes flushed, and nothing of it left in memory
        out = subprocess.run([sys.executable, "-m", "benchmarks.peers", method, bucket, prefix, where],
                             env={**os.environ, **lab.env()}, capture_output=True, text=True, timeout=1800)
    finally:
        if mount:
            mount.unmount()
        shutil.rmtree(work, ignore_errors=True)
    if out.returncode != 0:
        raise RuntimeError(f"{method} failed: {out.stderr.strip()[-2000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "page_cache_dropped": dropped}


def first_epochs(lab: Any, bucket: str, prefix: str, work: Path, methods: tuple[str, ...], repeats: int,
                 seed: int, say: Callable[[str], None] = print) -> dict[str, list[dict[str, Any]]]:
    """``repeats`` cold first epochs of every method, interleaved in a shuffled order per repetition."""
    from dataferry.harness.bench.ways import interleave  # pandas: not for the child process that runs one method

    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}

    def run(turn: Any) -> None:
        done = first_epoch(lab, turn.way, bucket, prefix, work / turn.way)
        runs[turn.way].append(done)
        say(f"    {turn.repeat}/{repeats} {turn.way:26s} {done['seconds']:6.2f} s  "
            f"{done['bytes'] / done['seconds'] / 1e6:7.1f} MB/s  CPU {done['cpu_s']:5.2f} s "
            f"(machine {done['machine_cpu_s']:5.2f} s)  peak RSS {done['peak_rss_mib']:.0f} MiB")

    interleave(dict.fromkeys(methods, run), repeats, seed)
    return runs


def ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median MB/s per method (with min-max), its median CPU seconds and the machine's (busy: the
    share of every core the machine kept busy), and each dataferry method over the fastest peer (by its median):
    the median of the repetitions' ratios, each repetition's methods run one after another, with the ratios; where
    :data:`DISK` ran, each over the slower of that peer and the disk, the same way."""
    rates = {m: [r["bytes"] / r["seconds"] / 1e6 for r in rs] for m, rs in runs.items()}
    table = {m: {"median_MBps": statistics.median(v), "min_MBps": min(v), "max_MBps": max(v), "n": len(v),
                 "median_s": statistics.median(r["seconds"] for r in runs[m]),
                 "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[m]),
                 "median_cpu_s": statistics.median(r["cpu_s"] for r in runs[m]),
                 "median_machine_cpu_s": statistics.median(r["machine_cpu_s"] for r in runs[m]),
                 "machine_busy": statistics.median(r["machine_cpu_s"] / (r["seconds"] * os.cpu_count())
                                                   for r in runs[m])} for m, v in rates.items()}
    peers = [m for m in table if m in PEERS]
    best = max(peers, key=lambda m: table[m]["median_MBps"]) if peers else None
    out: dict[str, Any] = {"methods": table, "best_peer": best}
    over = {}
    if best:  # round by round: the methods of a repetition ran a moment apart, in a shuffled order
        over["best_peer"] = rates[best]
        if DISK in table:  # the limit of a durable cache: the network (the best peer's pace) or this disk
            over["limit"] = [min(peer, disk) for peer, disk in zip(rates[best], rates[DISK], strict=True)]
    for m in (m for m in DATAFERRY if m in table):
        for name, theirs in over.items():
            out[f"{m}_vs_{name}_rounds"] = rounds = per_round(rates[m], theirs)
            out[f"{m}_vs_{name}"] = statistics.median(rounds)
    return out


def per_round(ours: list[float], theirs: list[float]) -> list[float]:
    """One ratio per round: the methods of a round ran in turn, a moment apart, so a machine that speeds up or slows
    down between rounds moves both sides of a ratio alike (the ratio of two medians of 5 moved by up to 40% between
    runs here). Its median is the figure."""
    return [a / b for a, b in zip(ours, theirs, strict=True)]


if __name__ == "__main__":
    print(json.dumps(_child(*sys.argv[1:5])))
