"""``python -m benchmarks shards``: bigger than the disk, tar shards through the cache against files through it and
webdataset's own cache, in a lab of its own (the comparison lesson 09 runs, at a benchmark's size)."""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataferry.course.lab.core import Lab
from dataferry.course.lab.profiles import PROFILES
from dataferry.course.lab.shardepochs import plot_shard_epochs, shard_epochs, summarize

KiB, MiB = 1 << 10, 1 << 20


def bench_shards(out: str | os.PathLike[str] = "build/bench/shards.json", *, samples: int = 4096,
                 sample_bytes: int = 64 * KiB, shard_bytes: int = 4 * MiB, budget_share: float = 0.2, epochs: int = 3,
                 workers: int = 2, batch: int = 64, shuffle: int = 1000, profile: str = "same-continent",
                 repeats: int = 1, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run :func:`shard_epochs` in a lab of its own under ``profile``; print a table, write JSON to ``out``
    and the figure beside it."""
    from dataferry.shards import make_shards
    from dataferry.sources import GCSSource

    bucket, prof = "bench-shards", PROFILES[profile]
    with Lab.private(gcsfuse=False) as lab, tempfile.TemporaryDirectory(prefix="dataferry-shardbench-") as tmp:
        work = Path(tmp)
        ds = lab.make_dataset(bucket, samples, sample_bytes, prefix="d", seed=5, shard_bytes=None)
        made = make_shards(GCSSource(bucket, "d/files/", lab.client(direct=True)), f"gs://{bucket}/d/shards/",
                           shard_bytes=shard_bytes, client=lab.client(direct=True), progress=False)
        data_bytes = sum(s.bytes for s in made)
        budget = int(budget_share * data_bytes)
        say(f"{samples} samples x {sample_bytes // KiB} KiB: {ds.total_bytes / 1e6:.0f} MB as files, "
            f"{len(made)} shards ({data_bytes / 1e6:.0f} MB); cache budget {budget / 1e6:.0f} MB; {epochs} epochs, "
            f"batch {batch}, {workers} workers, under {prof.label}")
        with lab.using_profile(prof):
            runs = shard_epochs(lab, bucket, "d/files/", "d/shards/", work, budget=budget, epochs=epochs,
                                workers=workers, batch=batch, shuffle=shuffle, repeats=repeats, say=say)
    where = f"{prof.label} on {platform.node()}"
    results: dict[str, Any] = {"experiment": "shards", "where": where, "profile": {"name": prof.name, "rtt_ms": prof.rtt_ms,
                                                                   "bandwidth_MBps": prof.bandwidth_MBps},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "samples": samples, "sample_bytes": sample_bytes,
               "files_bytes": ds.total_bytes, "shards": len(made), "shards_bytes": data_bytes, "budget_bytes": budget,
               "epochs": epochs, "repeats": repeats, "workers": workers, "batch": batch, "shuffle": shuffle, "runs": runs,
               "summary": summarize(runs, budget)}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot_shard_epochs(runs, budget, data_bytes, where).savefig(out.with_suffix(".png"), dpi=120)
        results["figure"] = str(out.with_suffix(".png"))
    except ImportError:
        say("(no matplotlib: the figure was not drawn)")
    out.write_text(json.dumps(results, indent=1))
    say("")
    say(f"| method ({where}) | epoch 1 samples/s | later samples/s | epoch 1 MB served | later MB served | "
        "peak disk / budget | shards speedup, epoch 1 / later |")
    say("|---|---|---|---|---|---|---|")

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for method, row in results["summary"].items():
        say(f"| {method} | {num(row['first_samples_per_s'], '.0f')} | {num(row['later_samples_per_s'], '.0f')} | "
            f"{num(row['first_served_MB'], '.1f')} | {num(row['later_served_MB'], '.1f')} | "
            f"{row['peak_disk_vs_budget']:.2f} | {num(row.get('first_shards_speedup'), '.2f')} / "
            f"{num(row.get('later_shards_speedup'), '.2f')} |")
    say(f"\nwrote {out}" + (f" and {results['figure']}" if "figure" in results else ""))
    return results
