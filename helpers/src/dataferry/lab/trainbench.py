"""Where one training epoch's time goes, in the lab: real flower JPEGs, real decoding, real DataLoader workers.

Rows per reader (torchvision's ``ImageFolder`` on local disk; :class:`~dataferry.CachedImageFolder` from a lab
bucket, its cache cold then warm; the same with decode-once), decoder (PIL; PIL's draft mode, which
decodes a JPEG at 1/2, 1/4 or 1/8 of its size when that still covers the crop, so not photos of 500
pixels, whose rows it leaves as PIL's; ``torchvision.io.decode_image``: :data:`dataferry.decode.DECODERS`) and DataLoader worker count. Each
row is one epoch fed into an emulated accelerator (a :class:`~dataferry.feed.ComputeProfile`, so the
figures do not depend on a GPU here): samples/s, accelerator utilisation (AU), the share of wall time
the step waited for data, and the CPU count; decode milliseconds per sample are timed on one core
beside it. Two ratios sum it up: ``decode_once_vs_jpeg_warm`` (warm cache, decode-once over decoding the
JPEG every epoch, same workers) and ``cold_epoch_vs_plain_read`` (epoch 1 through the cache from a
folder over plain reads of the same folder, same workers, page cache dropped before each). Figures are
``lab:<profile>`` numbers from this machine; ``make bench-train`` runs it.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataferry.bench.decoders import augment, decode_ms
from dataferry.decode import DECODERS
from dataferry.lab.core import Lab
from dataferry.lab.flowers import plan_flowers

__all__ = ["bench_train"]

DECODED_SIZE = 256


def _load_path(decode: Callable[[bytes], Any], path: str) -> Any:
    """ImageFolder's loader: the file's bytes through ``decode`` (a module-level function: picklable)."""
    return decode(Path(path).read_bytes())


def _decode_ms(folder: Path, decoder: Callable[[bytes], Any], n: int = 100) -> float:
    """Milliseconds per sample on one core: read from the page cache, decode, augment."""
    import random

    every = sorted(folder.rglob("*.jpg"))
    files = random.Random(0).sample(every, min(n, len(every)))  # all classes, not the first
    return decode_ms([f.read_bytes() for f in files], decoder, augment())


def _epochs(dataset: Any, workers: int, batch: int, compute: Any, epochs: int = 1) -> list[Any]:
    """``epochs`` epochs of ``dataset`` into ``compute``, by one DataLoader whose ``workers`` worker processes
    live across epochs (as a training job keeps them), in a shuffled order; a dataset through the cache
    fetches ahead of the reader (its prefetching sampler), as the course teaches. The first epoch pays the
    workers' start."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry.feed import feed

    sampler: Any = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    if hasattr(dataset, "prefetching"):
        sampler = dataset.prefetching(sampler)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                        persistent_workers=workers > 0)
    return feed(loader, compute, epochs=epochs)


def _drop_page_cache(folder: Path) -> None:
    from dataferry.timing import evict

    evict([str(p) for p in folder.rglob("*") if p.is_file()])


def bench_train(out: str | os.PathLike[str] = "build/bench/train.json", images: int = 800, batch: int = 32,
                workers: tuple[int, ...] | None = None, profile: str = "resnet50-h100-amp",
                region: str = "same-continent", plain_files: int = 4000, repeats: int = 3,
                say: Callable[[str], None] = print) -> dict:
    """Run the benchmark, print its table and write ``out`` (JSON). ``images`` flower JPEGs (a fifth per
    class) are served by a lab bucket under ``region`` and written to a local folder; ``workers`` defaults
    to 1 and this machine's CPU count."""
    import torch

    from dataferry import Cache, CachedDataset, CachedImageFolder, GCSSource, LocalSource
    from dataferry.dataset import SourceDataset
    from dataferry.feed import PROFILES, EmulatedCompute

    torch.set_num_threads(1)
    cpus = os.cpu_count() or 1
    widths = workers or tuple(sorted({1, cpus}))
    compute = EmulatedCompute(PROFILES[profile])
    rows: list[dict[str, Any]] = []
    with Lab.private(profile=region, gcsfuse=False) as lab:
        with tempfile.TemporaryDirectory(prefix="dataferry-bench-train-") as tmp:
            work = Path(tmp)
            flowers = plan_flowers(images // 5, seed=23, prefix="flowers/")
            say(f"drawing {images} flower JPEGs, a lab bucket under lab:{region} and a local copy ...")
            bucket = lab.create_bucket("train-bench")
            flowers.upload(bucket)
            flowers.write_to(work / "local")
            client = lab.client()  # through the shaped link
            local = work / "local" / "flowers"
            ms_per_sample = {d: _decode_ms(local, DECODERS[d]) for d in DECODERS}
            from torchvision.datasets import ImageFolder

            def row(reader: str, decoder: str, width: int, report: Any) -> None:
                rows.append({"reader": reader, "decoder": decoder, "workers": width, "samples_per_s": report.samples_per_s,
                             "au": report.au, "wait_share": report.wait_s / report.wall_s, "epoch_s": report.wall_s,
                             "decode_ms_per_sample": ms_per_sample.get(decoder), "cpus": cpus})
                say(f"  {reader:18} {decoder:12} {width} workers: {report.samples_per_s:7.0f} samples/s, AU "
                    f"{report.au:4.0%}, waiting {report.wait_s / report.wall_s:4.0%}")

            for width in widths:
                for decoder in DECODERS:
                    ds = ImageFolder(local, transform=augment(), loader=functools.partial(_load_path, DECODERS[decoder]))
                    for report in _epochs(ds, width, batch, compute, 1 + repeats)[1:]:  # the first warms up
                        row("imagefolder-local", decoder, width, report)
                    cached = CachedImageFolder(GCSSource(bucket.name, "flowers/", client), Cache(work / f"c-{width}-{decoder}"),
                                               transform=augment(), loader=DECODERS[decoder])
                    cold, *warm = _epochs(cached, width, batch, compute, 1 + repeats)
                    row("cache-cold", decoder, width, cold)
                    for report in warm:
                        row("cache-warm", decoder, width, report)
                once = CachedImageFolder(GCSSource(bucket.name, "flowers/", client), Cache(work / f"c-{width}-once"),
                                         transform=augment(), decode_once=DECODED_SIZE)
                cold, *warm = _epochs(once, width, batch, compute, 1 + repeats)
                row("decode-once-cold", f"pil@{DECODED_SIZE}", width, cold)
                for report in warm:
                    row("decode-once-warm", f"pil@{DECODED_SIZE}", width, report)

            # Epoch 1 through the cache from a folder vs plain reads of it: bytes only, no decoding.
            folder = work / "plain"
            blobs = [data for _, data in flowers.objects()]
            for i in range(plain_files):
                path = folder / f"{i % 50:02d}" / f"{i:06d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(blobs[i % len(blobs)])
            source = LocalSource(folder)
            entries = sorted(source.list(), key=lambda e: e.name)
            width = max(2, min(widths[-1], cpus))
            plain_rates, cold_rates = [], []
            for r in range(repeats):
                _drop_page_cache(folder)
                report = _epochs(SourceDataset(source, entries, decode=len), width, batch, compute)[0]
                plain_rates.append(report.samples_per_s)
                _drop_page_cache(folder)
                report = _epochs(CachedDataset(source, Cache(work / f"cold-{r}"), decode=len), width, batch, compute)[0]
                cold_rates.append(report.samples_per_s)
                say(f"  plain read {plain_rates[-1]:6.0f} files/s, cache epoch 1 {cold_rates[-1]:6.0f} files/s "
                    f"({width} workers, {plain_files} files)")

    def median(reader: str, decoder: str, width: int) -> float:
        return statistics.median(r["samples_per_s"] for r in rows
                                 if (r["reader"], r["decoder"], r["workers"]) == (reader, decoder, width))

    top = widths[-1]
    results = {
        "machine": {"cpus": cpus, "torch_threads": 1}, "where": f"lab:{region}", "images": images, "batch": batch,
        "profile": {"name": profile, "samples_per_s": PROFILES[profile].samples_per_s,
                    "source": PROFILES[profile].source},
        "decode_ms_per_sample": ms_per_sample, "rows": rows,
        "plain_read_files_per_s": plain_rates, "cold_epoch_files_per_s": cold_rates, "cold_epoch_workers": width,
        "decode_once_vs_jpeg_warm": median("decode-once-warm", f"pil@{DECODED_SIZE}", top) / median("cache-warm", "pil", top),
        "cold_epoch_vs_plain_read": statistics.median(cold_rates) / statistics.median(plain_rates),
        "goals": {"decode_once_vs_jpeg_warm": ">= 2.0", "cold_epoch_vs_plain_read": ">= 0.8"},
    }
    say(_table(results, top))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))
    say(f"-> {out}")
    return results


def _table(results: dict, width: int) -> str:
    lines = [f"| reader | decoder | workers | samples/s (median) | AU | waiting | decode ms/sample (1 core) |",
             "|---|---|---|---|---|---|---|"]
    seen: dict[tuple, list[dict]] = {}
    for r in results["rows"]:
        seen.setdefault((r["reader"], r["decoder"], r["workers"]), []).append(r)
    for (reader, decoder, workers), rs in seen.items():
        ms = rs[0]["decode_ms_per_sample"]
        lines.append(f"| {reader} | {decoder} | {workers} | {statistics.median(r['samples_per_s'] for r in rs):,.0f} | "
                     f"{statistics.median(r['au'] for r in rs):.0%} | {statistics.median(r['wait_share'] for r in rs):.0%} | "
                     f"{'' if ms is None else f'{ms:.2f}'} |")
    lines.append(f"\n{results['machine']['cpus']} CPUs, {results['where']}, AU against {results['profile']['name']} "
                 f"({results['profile']['samples_per_s']:,.0f} samples/s, emulated)")
    for key, goal in results["goals"].items():
        lines.append(f"{key}: {results[key]:.2f} (goal {goal}; {width} workers)")
    return "\n".join(lines)
