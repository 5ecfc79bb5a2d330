"""Will my GPU starve? Accelerator utilisation (AU) of each course method, epoch by epoch.

For every method the course teaches, a real PyTorch ``DataLoader`` with worker processes reads the
same files of a :class:`~dataferry.harness.bench.Target` into :func:`dataferry.harness.feed.feed`, which emulates
(or, on a GPU, runs) the compute. Methods, in data-flow order:

- ``local``: the files on local disk (the ceiling), read by the workers; ``folder``: a folder such as a
  Drive mount, read the same way;
- ``gcsfuse`` / ``gcsfuse-cache``: the bucket mounted, without and with gcsfuse's file cache;
- ``api``: each sample downloaded in ``__getitem__`` every epoch (:class:`~dataferry.dataset.SourceDataset`);
- ``stage``: :func:`~dataferry.stage` into an empty cache inside epoch 1's clock, then the cache;
- ``cache``: cache on first read with the prefetching sampler.

Before every epoch the files a method reads are dropped from the page cache, so later epochs read
their disk (or their mount), not RAM. Each epoch is a ``train`` row in the results, with its cache
state, region and compute profile; its ``first_byte_ns`` is the time the pipeline took to fill (:attr:`~dataferry.harness.feed.EpochReport.fill_s`:
the first step and the batches the workers fetched ahead), so the steady state after it can be told apart
(:func:`dataferry.course.findings.au.steady`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dataferry.harness.bench import Target, source_target
from dataferry.harness.bench.methods import method_state
from dataferry.cache import Cache
from dataferry.harness.feed import PROFILES, ComputeProfile, EmulatedCompute, EpochReport, TorchCompute, feed
from dataferry.sources import LocalSource
from dataferry.progress import progress_bar
from dataferry.staging import stage
from dataferry.harness.results import Results, load_results, size_text
from dataferry.harness.pagecache import evict

__all__ = ["AU_METHODS", "compare_au", "au_table", "bench_au", "run_au", "epoch_state"]

AU_METHODS = ("local", "gcsfuse", "gcsfuse-cache", "api", "stage", "cache")


class _StageFirst:
    """A loader whose first epoch starts by staging every entry into the cache (that is when training could
    start), so staging lands in epoch 1's first data wait."""

    def __init__(self, loader: Any, source: Any, cache: Cache, entries: Sequence[Any]) -> None:
        self.loader, self.source, self.cache, self.entries, self.staged = loader, source, cache, entries, False

    def __iter__(self) -> Iterator[Any]:
        if not self.staged:
            stage(self.source, self.cache, self.entries, progress=False)
            self.staged = True
        return iter(self.loader)


def _loader(method: str, target: Target, st: dict[str, Any], *, batch_size: int, workers: int, decode: Any,
            seed: int, pin_memory: bool) -> tuple[Any, Callable[[], list[Path]], int]:
    """The DataLoader of one method, the files it reads (for eviction) and its reader width."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry.dataset import CachedDataset, SourceDataset

    def loader(ds: Any, sampler: Any = None) -> Any:
        g = torch.Generator().manual_seed(seed)
        return DataLoader(ds, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                          sampler=sampler or RandomSampler(ds, generator=g), persistent_workers=workers > 0)

    names = set(target.names)
    if method in ("local", "folder", "gcsfuse", "gcsfuse-cache"):
        root = {"local": target.local_copy, "folder": target.folder}.get(method) or st["root"] / target.prefix
        source = LocalSource(root)
        entries = [source.stat(n) for n in target.names]
        return loader(SourceDataset(source, entries, decode)), lambda: [root / n for n in target.names], workers
    everything = list(target.source.list())
    listed = [e for e in everything if e.name in names]
    if method == "api":
        return loader(SourceDataset(target.source, listed, decode)), list, workers
    if method not in ("stage", "cache"):
        raise ValueError(f"unknown method {method!r}; known: {', '.join(AU_METHODS)}")
    cache = Cache(st["dir"] / "cache")
    ds = CachedDataset(target.source, cache, decode=decode, names=None if len(listed) == len(everything) else target.names)
    files = lambda: [cache.path(target.source, e) for e in listed if cache.contains(target.source, e)]  # noqa: E731
    if method == "stage":
        return _StageFirst(loader(ds), target.source, cache, listed), files, workers
    g = torch.Generator().manual_seed(seed)
    return loader(ds, ds.prefetching(RandomSampler(ds, generator=g))), files, workers


def epoch_state(method: str, epoch: int, evicted: str) -> str:
    """The cache state an epoch starts in: ``evicted`` is what mincore said of the files just dropped (a later
    epoch through the cache, or from gcsfuse's file cache, reads a cold local copy only when the drop of its pages was
    verified)."""
    if method in ("stage", "cache"):
        if epoch == 1:
            return "cold_verified"  # an empty cache: every byte crosses the network
        return "local_copy" if evicted == "cold_verified" else evicted
    if method == "api":
        return "cold_verified"  # every read crosses the network
    return "daemon_warm" if method == "gcsfuse-cache" and epoch > 1 and evicted == "cold_verified" else evicted


def compare_au(target: Target, results: Results, methods: Sequence[str], compute: ComputeProfile | TorchCompute, *,
               region: Any, runtime_kind: str, epochs: int = 2, repeats: int = 3, batch_size: int = 64,
               workers: int = 2, decode: Any = None, seed: int = 0, work: Path, progress: Any = None) -> list[dict]:
    """AU of each method, ``epochs`` epochs from a fresh start, ``repeats`` times with the methods interleaved
    in a seeded shuffled order. Every epoch becomes a ``train`` row in ``results`` as it ends (a failed method
    an error row); returns the rows."""
    rng = random.Random(seed)
    emulated = isinstance(compute, ComputeProfile)
    name = compute.name if isinstance(compute, ComputeProfile) else f"{compute.mode}:{compute.name}"
    rows: list[dict] = []
    common = {"region": region.region, "region_source": region.source, "runtime": runtime_kind, "compute_profile": name,
              "phase": "train", "file_bytes": target.mean_file_bytes}
    for repeat in range(1, repeats + 1):
        order = list(methods)
        rng.shuffle(order)
        for method in order:
            try:
                bench_method = method if method.startswith("gcsfuse") else "local"
                with method_state(bench_method, target, work) as st, warnings.catch_warnings():
                    # More workers than CPUs is the point here: they wait on I/O, not on a core.
                    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
                    loader, files, width = _loader(method, target, st, batch_size=batch_size, workers=workers,
                                                   decode=decode, seed=seed + repeat, pin_memory=not emulated)
                    evictions: dict[int, tuple[str, str]] = {}

                    def before(epoch: int) -> None:
                        paths = files()
                        if not paths:
                            # nothing local (epoch 1, or every read of a cache streamed): from the network
                            evictions[epoch] = ("cold_verified", "nothing local to evict")
                            return
                        r = evict(paths)
                        evictions[epoch] = (epoch_state(method, epoch, r.cache_state),
                                            f"{r.method}; {r.still_resident} of {r.files} files still resident")

                    def on_epoch(r: EpochReport) -> None:
                        rows.append(results.add(**common, method=method, repeat=repeat, **{"pass": r.epoch},
                                                file=f"({r.samples} samples)", bytes=target.total_bytes,
                                                ns=int(r.wall_s * 1e9), concurrency=width,
                                                cache_state=evictions[r.epoch][0], eviction=evictions[r.epoch][1],
                                                au=r.au, samples=r.samples, bound_by=r.bound_by,
                                                first_byte_ns=int(r.fill_s * 1e9) if r.waits_s else None,
                                                wait_p50_ns=int(r.wait_quantile(0.5) * 1e9),
                                                wait_p95_ns=int(r.wait_quantile(0.95) * 1e9)))
                        if progress is not None:
                            progress.update(1)

                    feed(loader, EmulatedCompute(compute) if isinstance(compute, ComputeProfile) else compute, epochs=epochs,
                         before_epoch=before, on_epoch=on_epoch)
            except Exception as e:  # noqa: BLE001 - a failed method is a row, not the end of the run
                rows.append(results.add(**common, method=method, repeat=repeat, **{"pass": 0},
                                        error=f"{e.__class__.__name__}: {e}"[:2000]))
    return rows


def au_table(rows: Any) -> str:
    """A markdown table: median AU (to a tenth of a percent, so that 89.9% is not printed as a threshold's 90%;
    min-max in whole percent, rounded outward; n) per setting x compute profile x method x epoch x cache state. A
    setting is a lesson (when the rows name one), a sample count, a sample size, a region and a runtime kind: rows
    differing in any are never pooled."""
    ok = rows[(rows["phase"] == "train") & (rows["error"] == "")]
    ok = ok.assign(n_samples=ok["samples"].fillna(0).astype(int),
                   size=[size_text(b / n) if n else "-" for b, n in zip(ok["bytes"].fillna(0), ok["samples"].fillna(0))],
                   cache_state=ok["cache_state"].fillna("not recorded") if "cache_state" in ok.columns else "not recorded")
    if "lesson" in ok.columns:  # a lesson by its number (its results folder 08_au: 08), so the table fits a page
        ok = ok.assign(lesson=ok["lesson"].astype(str).str.replace(r"^(\d\d)_.*", r"\1", regex=True))
    keys = (["lesson"] if "lesson" in ok.columns else []) + ["n_samples", "size", "region", "runtime", "compute_profile",
                                                             "method", "pass", "cache_state"]
    names = {"n_samples": "samples", "size": "sample size", "compute_profile": "compute profile", "pass": "epoch",
             "cache_state": "cache state"}
    head = [names.get(k, k) for k in keys]
    lines = ["| " + " | ".join(head) + " | AU median (min-max) | n | samples/s | bound by |", "|" + "---|" * (len(head) + 4)]
    for key, g in ok.groupby(keys):
        sps = (g["samples"] / (g["ns"] / 1e9)).median()
        low, high = math.floor(round(g["au"].min() * 100, 6)), math.ceil(round(g["au"].max() * 100, 6))
        lines.append(f"| {' | '.join(map(str, key))} | {g['au'].median():.1%} ({low}-{high}%) | {len(g)} | {sps:.0f} | "
                     f"{g['bound_by'].mode().iloc[0]} |")
    return "\n".join(lines)


def bench_au(compute: str | ComputeProfile | Sequence[str | ComputeProfile], source: str, *,
             out: str | Path = "build/bench/au", json_path: str | Path | None = None,
             methods: Sequence[str] | None = None, n_files: int = 256, epochs: int = 2, repeats: int = 5,
             batch_size: int = 32, workers: int = 4, seed: int = 0, region: str | None = None,
             say: Callable[[str], None] = print) -> dict:
    """``dataferry bench --au PROFILE SOURCE``: AU of each method under each ``compute`` profile (names in
    :data:`dataferry.harness.feed.PROFILES`, or profiles) on your data (``gs://bucket/prefix`` or a folder), a
    seeded sample of ``n_files``. Prints the table, writes the rows under ``out`` and a JSON summary.
    (In the lab: :func:`dataferry.course.lab.methodsbench.bench_au_lab`.)"""
    from dataferry.harness.runtime import detect_region

    work = Path(tempfile.mkdtemp(prefix="dataferry-au-"))
    try:
        target = source_target(source, max_files=n_files, seed=seed)
        available = (["folder", "stage", "cache"] if target.bucket is None else
                     ["api", "stage", "cache"] + (["gcsfuse", "gcsfuse-cache"] if target.mount else []))
        return run_au(compute, target, [(contextlib.nullcontext(), detect_region(region))], methods or available,
                      where=source, out=out, json_path=json_path, epochs=epochs, repeats=repeats,
                      batch_size=batch_size, workers=workers, seed=seed, work=work, say=say)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_au(compute: str | ComputeProfile | Sequence[str | ComputeProfile], target: Target,
           regions: Sequence[tuple[contextlib.AbstractContextManager, Any]], methods: Sequence[str], *, where: str,
           out: str | os.PathLike[str], json_path: str | os.PathLike[str] | None, epochs: int, repeats: int, batch_size: int, workers: int,
           seed: int, work: Path, say: Callable[[str], None]) -> dict:
    """The AU comparison once its files are chosen: each of ``regions`` (the context that makes it so,
    and its :class:`~dataferry.harness.runtime.Region`) x each compute profile x each method, ``repeats`` times;
    prints the table and writes the rows under ``out`` and a JSON summary. ``where`` names the data."""
    from dataferry.harness.bench import check_methods
    from dataferry.harness.runtime import capture

    check_methods(methods, (*AU_METHODS, "folder"))
    computes = [PROFILES[c] if isinstance(c, str) else c
                for c in ([compute] if isinstance(compute, (str, ComputeProfile)) else compute)]
    out, methods = Path(out), list(methods)
    runtime = capture(str(work))
    meta = {"experiment": "au", "where": where, "runtime": runtime.to_dict(),
            "compute_profiles": [{**c.__dict__} for c in computes], "seed": seed, "epochs": epochs, "repeats": repeats,
            "batch_size": batch_size, "workers": workers, "methods": methods,
            "dataset": {"files": len(target.names), "total_bytes": target.total_bytes}}
    with Results(out, meta) as results, progress_bar(total=len(regions) * len(computes) * repeats * len(methods) * epochs,
                                             desc="bench --au", unit="epoch") as bar:
        for shaping, region in regions:
            with shaping:
                for c in computes:
                    compare_au(target, results, methods, c, region=region, runtime_kind=runtime.kind,
                               epochs=epochs, repeats=repeats, batch_size=batch_size, workers=workers, seed=seed,
                               work=work, progress=bar)
    rows = load_results(results.csv_path, run_id=results.run_id)
    table = au_table(rows)
    needs = [{"compute_profile": c.name, "needs_MBps": c.needs_MBps(target.mean_file_bytes), "source": c.source}
             for c in computes]
    for c, n in zip(computes, needs):
        say(f"{c!r} needs {n['needs_MBps']:.1f} MB/s of {target.mean_file_bytes / 1e3:.0f} kB samples; "
            f"source: {c.source}")
    say(table)
    result = {"run_id": results.run_id, "results": str(results.csv_path), "needs": needs, "table": table,
              "au": [{"region": r, "compute_profile": c, "method": m, "epoch": int(e), "median": g["au"].median(),
                      "min": g["au"].min(), "max": g["au"].max(), "n": len(g)}
                     for (r, c, m, e), g in rows[rows["error"] == ""].groupby(
                         ["region", "compute_profile", "method", "pass"])],
              "errors": rows[rows["error"] != ""]["error"].tolist()}
    path = Path(json_path or out / "au.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    say(f"rows: {results.csv_path}\nsummary: {path}")
    return result
