"""Bigger than the disk, side by side: tar shards through dataferry's cache, the same samples as files
through the cache, and the same shards through webdataset's own cache, in the lab.

Every method reads a data set several times its cache budget for a few epochs in a fresh process, with
the same DataLoader (batch size, workers) and a shuffle each epoch. Per epoch it records samples/s, the
bytes the server sent (from fake-gcs-server's access log: objects served times their size) and the most
bytes of cached data on disk (sampled every 20 ms). Before each later epoch the kept files are dropped from the
page cache, so a hit is a disk read. Figures are ``lab:<profile>`` numbers; lesson 09 runs it, and ``make bench-shards`` (``benchmarks/shards.py``)
at a benchmark's size.

The child side (``python -m dataferry.course.lab.shardepochs``) reads its settings as JSON on stdin and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from dataferry.cache.layout import Layout
from dataferry.harness.folders import sample_every
from dataferry.course.lab.core import Lab

__all__ = ["METHODS", "shard_epochs", "summarize", "plot_shard_epochs"]

KiB, MiB = 1 << 10, 1 << 20
METHODS = ("dataferry-shards", "dataferry-files", "webdataset-cache")


def _count_shard_batch(batch: list[dict]) -> tuple[int, int]:
    return len(batch), sum(len(v) for s in batch for k, v in s.items() if not k.startswith("__"))


def _count_file_batch(batch: list[bytes]) -> tuple[int, int]:
    return len(batch), sum(map(len, batch))


def _data_files(folder: Path) -> list[str]:
    """The cached data under ``folder``: dataferry's cache keeps it in ``objects/`` (its index
    beside it), webdataset's in the folder itself."""
    return [os.path.join(d, f) for top in Layout.data_folders(folder) for d, _, fs in os.walk(top) for f in fs]


def _disk_bytes(folder: Path) -> int:
    total = 0
    for path in _data_files(folder):
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:  # evicted or renamed while we looked
            pass
    return total


def _epochs_of(method: str, c: dict[str, Any]) -> Callable[[int], Iterable[tuple[int, int]]]:
    """``epoch -> batches of (samples, bytes)`` for ``method``; clients and datasets made before any timing."""
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry import Cache, CachedDataset, GCSSource
    from dataferry.shards import ShardDataset, ShardLoader

    work, loader_args = Path(c["work"]), {"batch_size": c["batch"], "num_workers": c["workers"]}
    if method == "dataferry-shards":
        ds = ShardDataset(GCSSource(c["bucket"], c["shards"]), Cache(work, max_bytes=c["budget"], min_free_bytes=0),
                          shuffle=c["shuffle"], seed=c["seed"])
        loader = ShardLoader(ds, collate_fn=_count_shard_batch, **loader_args)

        def shards(epoch: int) -> Iterable[tuple[int, int]]:
            loader.set_epoch(epoch)
            return loader

        return shards
    if method == "dataferry-files":
        files = CachedDataset(GCSSource(c["bucket"], c["files"]), Cache(work, max_bytes=c["budget"], min_free_bytes=0))

        def each_file(epoch: int) -> Iterable[tuple[int, int]]:
            import torch

            order = RandomSampler(files, generator=torch.Generator().manual_seed(c["seed"] * 1000 + epoch))
            return DataLoader(files, sampler=files.prefetching(order), collate_fn=_count_file_batch, **loader_args)

        return each_file
    if method == "webdataset-cache":
        import webdataset as wds

        urls = [f"{c['endpoint']}/download/storage/v1/b/{c['bucket']}/o/{urllib.parse.quote(c['shards'] + n, safe='')}"
                "?alt=media" for n in c["shard_names"]]
        work.mkdir(parents=True, exist_ok=True)

        def webdataset(epoch: int) -> Iterable[tuple[int, int]]:
            # A new pipeline per epoch with its own seed: fresh DataLoader workers would otherwise replay one order.
            ds = wds.WebDataset(urls, shardshuffle=len(urls), cache_dir=str(work), cache_size=c["budget"],
                                seed=c["seed"] * 1000 + epoch).shuffle(c["shuffle"])
            return DataLoader(ds, collate_fn=_count_shard_batch, **loader_args)

        return webdataset
    raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")


def _served_bytes(lab: Lab, bucket: str, sizes: dict[str, int]) -> tuple[int, int]:
    counts = lab.downloads(bucket)
    return sum(counts.values()), sum(n * sizes.get(name, 0) for name, n in counts.items())


def _child(c: dict[str, Any]) -> dict[str, Any]:
    """Every epoch of one method: samples, seconds, bytes served by the lab, the cache's peak disk use."""
    from dataferry.harness.pagecache import evict

    lab, work = Lab(state_dir=c["lab_state"]), Path(c["work"])
    read_epoch = _epochs_of(c["method"], c)
    out = []
    for epoch in range(c["epochs"]):
        state = evict(_data_files(work)).cache_state if epoch else "cold_empty"
        requests0, served0 = _served_bytes(lab, c["bucket"], c["sizes"])
        samples = read = 0
        with sample_every(0.02, lambda: _disk_bytes(work)) as disk:
            t0 = time.perf_counter()
            for n, b in read_epoch(epoch):
                samples, read = samples + n, read + b
            seconds = time.perf_counter() - t0
        requests1, served1 = _served_bytes(lab, c["bucket"], c["sizes"])
        out.append({"epoch": epoch + 1, "seconds": seconds, "samples": samples, "bytes": read,
                    "served_bytes": served1 - served0, "requests": requests1 - requests0,
                    "peak_disk_bytes": max(bytes_ for _, bytes_ in disk), "cache_state": state})
    return {"epochs": out}


def shard_epochs(lab: Lab, bucket: str, files: str, shards: str, work: Path, *, budget: int, epochs: int = 3,
                 methods: Sequence[str] = METHODS, workers: int = 2, batch: int = 64, shuffle: int = 1000,
                 seed: int = 0, repeats: int = 1,
                 say: Callable[[str], None] = print) -> dict[str, list[dict[str, Any]]]:
    """``epochs`` epochs of each method, each in a fresh process with an empty cache of ``budget`` bytes, in
    ``repeats`` rounds of the methods in a shuffled order (:func:`~dataferry.harness.bench.ways.interleave`); the same
    samples as files under ``files`` and as shards under ``shards``. Every epoch's row names its ``repeat``."""
    from dataferry.harness.bench.ways import interleave  # pandas: not for the child process that runs one method
    from dataferry.errors import BadArgument
    from dataferry.sources import GCSSource

    if repeats < 1 or epochs < 1:
        raise BadArgument(f"repeats and epochs must be at least 1, not {repeats} and {epochs}")
    client = lab.client(direct=True)
    files, shards = (GCSSource(bucket, p, client).prefix for p in (files, shards))  # "a/b" -> "a/b/"
    listed = {p: list(GCSSource(bucket, p, client).list()) for p in (files, shards)}
    sizes = {p + e.name: e.size for p, entries in listed.items() for e in entries}
    shard_names = sorted(e.name for e in listed[shards] if e.name.endswith(".tar"))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}

    def run(turn: Any) -> None:
        runs[turn.way] += [{"repeat": turn.repeat, **e} for e in _one_run(
            lab, turn.way, work, bucket, files, shards, sizes, shard_names, budget, epochs, workers, batch, shuffle,
            seed + turn.repeat - 1, say)]

    interleave(dict.fromkeys(methods, run), repeats, seed)
    return runs


def _one_run(lab: Lab, method: str, work: Path, bucket: str, files: str, shards: str, sizes: dict[str, int],
             shard_names: list[str], budget: int, epochs: int, workers: int, batch: int, shuffle: int, seed: int,
             say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every epoch of one method, in a fresh process with an empty cache."""
    where = work / method
    shutil.rmtree(where, ignore_errors=True)
    config = {"method": method, "bucket": bucket, "files": files, "shards": shards, "shard_names": shard_names,
              "sizes": sizes, "work": str(where), "budget": budget, "epochs": epochs, "workers": workers,
              "batch": batch, "shuffle": shuffle, "seed": seed, "endpoint": lab.endpoint,
              "lab_state": str(lab.state_dir)}
    proc = subprocess.run([sys.executable, "-m", "dataferry.course.lab.shardepochs"], input=json.dumps(config),
                          env={**os.environ, **lab.env()}, capture_output=True, text=True, timeout=3600)
    shutil.rmtree(where, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{method} failed: {proc.stderr.strip()[-2000:]}")
    done: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])["epochs"]
    for e in done:
        say(f"  {method:17s} epoch {e['epoch']}: {e['samples'] / e['seconds']:8.0f} samples/s, "
            f"served {e['served_bytes'] / 1e6:7.1f} MB, disk peak {e['peak_disk_bytes'] / budget:4.2f}x budget "
            f"({e['cache_state']})")
    return done


def summarize(runs: dict[str, list[dict[str, Any]]], budget: int) -> dict[str, Any]:
    """Per method, over every repeat: epoch 1's samples/s and MB served (medians over the repeats), later
    epochs' (medians over every later epoch of every repeat), peak disk over the budget (the most of any);
    and each peer method's rate over dataferry-shards'."""
    table: dict[str, Any] = {}
    for method, epochs in runs.items():
        first = [e for e in epochs if e["epoch"] == 1]
        later = [e for e in epochs if e["epoch"] > 1]
        table[method] = {"repeats": len(first),
                         "first_samples_per_s": statistics.median(e["samples"] / e["seconds"] for e in first),
                         "later_samples_per_s": (statistics.median(e["samples"] / e["seconds"] for e in later)
                                                 if later else None),
                         "first_served_MB": statistics.median(e["served_bytes"] for e in first) / 1e6,
                         "later_served_MB": statistics.median(e["served_bytes"] for e in later) / 1e6 if later else None,
                         "peak_disk_vs_budget": max(e["peak_disk_bytes"] for e in epochs) / budget}
    if "dataferry-shards" in table:
        ours = table["dataferry-shards"]
        for method, row in table.items():
            for when in ("first", "later"):
                if row[f"{when}_samples_per_s"] and ours[f"{when}_samples_per_s"]:
                    row[f"{when}_shards_speedup"] = ours[f"{when}_samples_per_s"] / row[f"{when}_samples_per_s"]
    return table


def plot_shard_epochs(runs: dict[str, list[dict[str, Any]]], budget: int, data_bytes: int, where: str) -> Any:
    """Three panels: samples/s, MB served and the cache's peak disk per epoch and method (bars: the median
    over the repeats; dots: each repeat)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    width = 0.8 / len(runs)
    for i, (method, epochs) in enumerate(runs.items()):
        offset = (i - (len(runs) - 1) / 2) * width
        seen = sorted({e["epoch"] for e in epochs})
        for ax, value in zip(axes, (lambda e: e["samples"] / e["seconds"], lambda e: e["served_bytes"] / 1e6,
                                    lambda e: e["peak_disk_bytes"] / 1e6)):
            per_epoch = [[value(e) for e in epochs if e["epoch"] == n] for n in seen]
            ax.bar([n + offset for n in seen], [statistics.median(v) for v in per_epoch], width, label=method,
                   color=f"C{i}", alpha=0.75)
            ax.scatter([n + offset for n, v in zip(seen, per_epoch) for _ in v], [x for v in per_epoch for x in v],
                       color="black", s=6, zorder=3)  # a dot per repeat: the bar is their median
    epochs_seen = sorted({e["epoch"] for es in runs.values() for e in es})
    whole = axes[1].axhline(data_bytes / 1e6, color="black", ls=":", lw=1, label="whole data set")
    limit = axes[2].axhline(budget / 1e6, color="red", ls="--", lw=1, label="budget")
    for ax, label in zip(axes, ("samples/s", "MB served by the bucket", "peak disk of the cache (MB)")):
        ax.set(xlabel="epoch", ylabel=label, xticks=epochs_seen)
    bars = axes[0].get_legend_handles_labels()[0]
    fig.legend([*bars, whole, limit], [*runs, "whole data set", "budget"], loc="outside lower center",
               ncol=len(runs) + 2, fontsize=8)
    fig.suptitle(f"{data_bytes / 1e6:.0f} MB through a {budget / 1e6:.0f} MB cache, {where}", fontsize=10)
    plt.close(fig)  # returned, not shown by pyplot: a notebook shows it once, as a cell's value
    return fig


if __name__ == "__main__":
    print(json.dumps(_child(json.load(sys.stdin))))
