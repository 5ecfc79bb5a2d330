"""Where one training epoch's time goes, in the lab: real flower JPEGs, real decoding, real DataLoader workers.

Rows per reader (torchvision's ``ImageFolder`` on local disk; :class:`~dataferry.CachedImageFolder` from a lab
bucket, its cache cold then warm; the same with decode-once), decoder (PIL; PIL's draft mode, which
decodes a JPEG at 1/2, 1/4 or 1/8 of its size when that still covers the crop, so not photos of 500
pixels, whose rows it leaves as PIL's; ``torchvision.io.decode_image``: :data:`dataferry.decode.DECODERS`) and DataLoader worker count. Each
row is one epoch fed into an emulated accelerator (a :class:`~dataferry.harness.feed.ComputeProfile`, so the
figures do not depend on a GPU here): samples/s, accelerator utilisation (AU), the share of wall time
the step waited for data, and the CPU count; decode milliseconds per sample are timed on one core
beside it. With a CUDA GPU, ``gpu`` rows too: the workers read bytes and the GPU decodes and crops each
batch (:class:`~dataferry.decode.DecodeOnDevice`; its milliseconds are per image on the GPU). A
``limit-in-memory`` row is this machine's limit for such a feed: the decoded pictures held in RAM, cropped and
flipped by the same workers; and a table splits each pipeline's sample time into its stages (read, decode, augment,
collate, timed on one core) and what is left (the hand-over to the main process, the cores' sharing). The feed's
peers run beside them where installed (:mod:`benchmarks.feedpeers`: litdata with every decoder, DALI's CPU
pipeline; ``ImageFolder`` is one everywhere), so ``decode_once_vs_best_peer`` and ``jpeg_cache_vs_best_peer`` (the
cache's JPEG path over the fastest peer with the same decoder, the worst decoder's) compare them. More ratios
sum it up: ``decode_once_vs_jpeg_warm`` (warm cache, decode-once over decoding the JPEG every epoch, same
workers), ``decode_once_vs_limit``, ``budget_vs_none`` (decode-once's warm cache under a budget over the same
cache without one: under a budget every read demotes its entry) and ``cold_epoch_vs_plain_read`` (epoch 1 through
the cache from a folder over plain reads of the same folder, same workers, page cache dropped before each); and
``mounted_prefetch_gain`` says what the prefetching sampler buys epoch 1 from a gcsfuse mount. Figures are
``lab:<profile>`` numbers from this machine; ``make bench-train`` runs it. The pipelines of one worker count take
their epochs in turns, each loader keeping its workers (:func:`_interleaved`), so that drift in a shared machine
falls on all of them alike (the ``gpu`` rows, only where CUDA is, run theirs after them); each ratio with a goal is
the median of the ratios of its rounds (``ratio_rounds`` in the JSON: their spread is printed beside it).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataferry.harness.bench.decoders import GPU, STAGES, augment, decode_ms, device_decode_ms, interleaved_runs, stage_us
from dataferry.cache.placing import syncfs
from dataferry.decode import DECODERS, encoded, pixels
from benchmarks import feedpeers
from dataferry.course.lab.core import Lab
from dataferry.course.lab.flowers import plan_flowers
from benchmarks.peers import per_round

__all__ = ["InMemoryImages", "bench_train", "cold_epoch_vs_plain_read", "mounted_epoch_rates"]

DECODED_SIZE = 256
LIMIT = "limit-in-memory"  # the reader of this machine's limit: decoded pixels in RAM, the same crops and workers
BUDGETED = "decode-once-budget"  # decode-once's warm cache under a budget: every read demotes its entry


class InMemoryImages:
    """Decoded images held in memory, each ``(transform(image), target)``: this machine's limit for a feed that
    crops and flips decoded pixels in its DataLoader workers (nothing read, nothing decoded)."""

    def __init__(self, images: list[Any], targets: list[int], transform: Callable[[Any], Any]) -> None:
        self.images, self.targets, self.transform = images, targets, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transform(self.images[index]), self.targets[index]


def _same(x: Any) -> Any:
    return x


def _stage_table(stages: dict[str, dict[str, float]], rates: dict[str, float], workers: int) -> list[str]:
    """Each pipeline's sample time in a worker, stage by stage, as shares of its wall time per sample per worker
    (``workers`` / its samples per second): what is left is the hand-over to the main process and the cores'
    sharing."""
    lines = [f"\nWhere a sample's time goes ({workers} workers; microseconds on one core, and the share of the wall "
             "time per sample per worker)", "| pipeline | " + " | ".join(STAGES) + " | hand-over and the rest |",
             "|---|" + "---|" * (len(STAGES) + 1)]
    for name, us in stages.items():
        wall = workers * 1e6 / rates[name]
        rest = wall - sum(us.values())
        lines.append(f"| {name} | " + " | ".join(f"{us[s]:.0f} ({us[s] / wall:.0%})" for s in STAGES)
                     + f" | {rest:.0f} ({rest / wall:.0%}) |")
    return lines


def _load_path(decode: Callable[[bytes], Any], path: str) -> Any:
    """ImageFolder's loader: the file's bytes through ``decode`` (a module-level function: picklable)."""
    return decode(Path(path).read_bytes())


def _decode_ms(folder: Path, decoder: Callable[[bytes], Any], n: int = 100) -> float:
    """Milliseconds per sample on one core: read from the page cache, decode, augment."""
    import random

    every = sorted(folder.rglob("*.jpg"))
    files = random.Random(0).sample(every, min(n, len(every)))  # all classes, not the first
    return decode_ms([f.read_bytes() for f in files], decoder, augment())


def _epochs(dataset: Any, workers: int, batch: int, compute: Any, epochs: int = 1, on_gpu: bool = False,
            prefetch: bool = True) -> list[Any]:
    """``epochs`` epochs of ``dataset`` into ``compute``, by one DataLoader whose ``workers`` worker processes
    live across epochs (as a training job keeps them), in a shuffled order; a dataset through the cache
    fetches ahead of the reader (its prefetching sampler), as the course teaches. The first epoch pays the
    workers' start. ``on_gpu``: the dataset gives encoded JPEGs, decoded and cropped on the GPU in batches;
    ``prefetch=False``: no prefetching sampler."""
    from dataferry.harness.feed import feed

    return feed(_loader(dataset, workers, batch, on_gpu, prefetch), compute, epochs=epochs)


def _loader(dataset: Any, workers: int, batch: int, on_gpu: bool = False, prefetch: bool = True) -> Any:
    """The loader of :func:`_epochs`: a DataLoader whose ``workers`` worker processes live across epochs (``on_gpu``:
    wrapped so that each batch is decoded on the GPU)."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry.decode import DecodeOnDevice, collate_encoded

    sampler: Any = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    if prefetch and hasattr(dataset, "prefetching"):
        sampler = dataset.prefetching(sampler)
    loader: Any = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers, pin_memory=on_gpu,
                             persistent_workers=workers > 0, collate_fn=collate_encoded if on_gpu else None)
    return _Waited(DecodeOnDevice(loader)) if on_gpu else loader


class _Waited:
    """Batches decoded on the GPU, each waited for (``torch.cuda.synchronize``) before the step gets it: the
    emulated accelerator never waits on the GPU, so the decoding's time is counted as waiting for data
    (a real model would also share the GPU with it: ``scripts/gpu_feed.py`` trains one)."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        import torch

        for batch in self.batches:
            torch.cuda.synchronize()
            yield batch


def _open_files_up_to_the_hard_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _drop_page_cache(folder: Path) -> None:
    from dataferry.harness.pagecache import evict

    evict([str(p) for p in folder.rglob("*") if p.is_file()])


class _WritesCopies:
    """Epoch 1's copies alone: sample ``i`` is a file written (created, written, renamed) into one of 256 folders
    under ``folder``, as the cache places its copies; nothing is read (made durable after the epoch, as the cache's
    are). Reading a file and then writing its copy, each at its own rate, one after the other, is what epoch 1
    through the cache is set against: a reference, not a ceiling (one worker's read may overlap another's write)."""

    def __init__(self, blobs: list[bytes], folder: Path, files: int) -> None:
        self.blobs, self.folder, self.files = blobs, folder, files
        for i in range(256):
            (folder / f"{i:02x}").mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return self.files

    def __getitem__(self, i: int) -> int:
        path = self.folder / f"{i % 256:02x}" / f"{i:06d}"
        data = self.blobs[i % len(self.blobs)]
        with open(f"{path}.part", "wb") as f:
            f.write(data)
        os.replace(f"{path}.part", path)
        return len(data)


def cold_epoch_vs_plain_read(blobs: list[bytes], work: Path, width: int, compute: Any, *, files: int = 4000,
                             repeats: int = 3, batch: int = 32,
                             say: Callable[[str], None] = print) -> tuple[list[float], list[float], list[float]]:
    """Epoch 1 through the cache from a folder vs plain reads of the same folder, bytes only (no decoding):
    ``files`` files (``blobs`` over and over, 50 folders) under ``work``, read by ``width`` DataLoader
    workers into ``compute``, the page cache dropped before each; ``repeats`` times each, through the
    prefetching sampler as a user would (which leaves a folder on local disk to the workers); and, in each
    round, the same workers writing the copies alone (:class:`_WritesCopies`). Returns the files/s of each plain
    read, of each cache epoch 1 and of each writing of the copies."""
    from dataferry import Cache, CachedDataset, LocalSource
    from dataferry.dataset import SourceDataset

    folder = work / "plain"
    for i in range(files):
        path = folder / f"{i % 50:02d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blobs[i % len(blobs)])
    source = LocalSource(folder)
    entries = sorted(source.list(), key=lambda e: e.name)
    plain_rates, cold_rates, write_rates = [], [], []
    for r in range(repeats):
        _drop_page_cache(folder)
        report = _epochs(SourceDataset(source, entries, decode=len), width, batch, compute)[0]
        plain_rates.append(report.samples_per_s)
        _drop_page_cache(folder)
        cached = CachedDataset(source, Cache(work / f"cold-{width}-{r}"), decode=len)
        report = _epochs(cached, width, batch, compute)[0]
        cold_rates.append(report.samples_per_s)
        copies = work / f"copies-{width}-{r}"
        report = _epochs(_WritesCopies(blobs, copies, files), width, batch, compute)[0]
        t0 = time.perf_counter()
        syncfs(str(copies))  # durable, as the cache's copies are (and nothing left to flush in the next round)
        write_rates.append(files / (report.wall_s + time.perf_counter() - t0))
        say(f"  plain read {plain_rates[-1]:6.0f} files/s, cache epoch 1 {cold_rates[-1]:6.0f} files/s, writing the "
            f"copies alone {write_rates[-1]:6.0f} files/s ({width} workers, {files} files)")
    return plain_rates, cold_rates, write_rates


def mounted_epoch_rates(lab: Lab, blobs: list[bytes], work: Path, width: int, compute: Any, *, files: int = 300,
                          repeats: int = 3, batch: int = 32, say: Callable[[str], None] = print) -> tuple[list[float], list[float]]:
    """Epoch 1 through the cache from a gcsfuse mount of a lab bucket, with the prefetching sampler and
    without it, ``width`` workers; each run reads ``files`` objects no earlier run read (gcsfuse keeps what
    it has read), the two kinds of run alternating. A mounted folder (as Drive in Colab) waits on the
    network for every file, so fetching ahead should pay there, where on local disk it only raced the
    workers. Returns the files/s of each run with, and of each without."""
    from dataferry import Cache, CachedDataset, LocalSource

    gcsfuse = lab.status()["gcsfuse"]
    if not gcsfuse["available"]:
        say(f"  no gcsfuse mount here ({gcsfuse.get('why', 'unavailable')}): prefetching from a mount not measured")
        return [], []
    bucket = lab.create_bucket("train-bench-mounted")
    for run in range(2 * repeats):
        for i in range(files):
            bucket.blob(f"r{run}/{i:05d}.jpg").upload_from_string(blobs[i % len(blobs)])
    ahead: list[float] = []
    alone: list[float] = []
    with lab.mount(bucket.name) as mount:
        for run in range(2 * repeats):
            prefetch = run % 4 in (0, 3)  # with, without, without, with, ...: neither always goes first
            dataset = CachedDataset(LocalSource(mount.mountpoint / f"r{run}"), Cache(work / f"mounted-{run}"), decode=len)
            report = _epochs(dataset, width, batch, compute, prefetch=prefetch)[0]
            (ahead if prefetch else alone).append(report.samples_per_s)
            say(f"  gcsfuse mount, cache epoch 1 {'with' if prefetch else 'without'} prefetching: "
                f"{report.samples_per_s:6.0f} files/s ({width} workers, {files} files)")
    return ahead, alone


def bench_train(out: str | os.PathLike[str] = "build/bench/train.json", images: int = 800, batch: int = 32,
                workers: tuple[int, ...] | None = None, profile: str = "resnet50-h100-amp",
                region: str = "same-continent", plain_files: int = 4000, repeats: int = 7,
                say: Callable[[str], None] = print) -> dict:
    """Run the benchmark, print its table and write ``out`` (JSON). ``images`` flower JPEGs (a fifth per
    class) are served by a lab bucket under ``region`` and written to a local folder; ``workers`` defaults
    to 1 and this machine's CPU count."""
    import torch

    from dataferry import Cache, CachedImageFolder, GCSSource
    from dataferry.harness.feed import PROFILES, EmulatedCompute

    torch.set_num_threads(1)
    _open_files_up_to_the_hard_limit()  # every loader of one worker count is open at once, with its workers' pipes
    cpus = os.cpu_count() or 1
    widths = workers or tuple(sorted({1, cpus}))
    compute = EmulatedCompute(PROFILES[profile])
    rows: list[dict[str, Any]] = []
    with Lab.private(profile=region, gcsfuse=True) as lab:
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
            if torch.cuda.is_available():
                ms_per_sample[GPU] = device_decode_ms([p.read_bytes() for p in sorted(local.rglob("*.jpg"))[:256]])
            from torchvision.datasets import ImageFolder

            def row(reader: str, decoder: str, report: Any, width: int) -> None:
                rows.append({"reader": reader, "decoder": decoder, "workers": width, "samples_per_s": report.samples_per_s,
                             "au": report.au, "wait_share": report.wait_s / report.wall_s, "epoch_s": report.wall_s,
                             "decode_ms_per_sample": ms_per_sample.get(decoder), "cpus": cpus})
                say(f"  {reader:18} {decoder:12} {width} workers: {report.samples_per_s:7.0f} samples/s, AU "
                    f"{report.au:4.0%}, waiting {report.wait_s / report.wall_s:4.0%}")

            stages: dict[str, dict[str, float]] = {}
            for width in widths:
                jpegs: dict[str, Any] = {}
                pipelines: list[tuple[str, str, Callable[[], Any]]] = []
                for decoder in DECODERS:
                    ds = ImageFolder(local, transform=augment(), loader=functools.partial(_load_path, DECODERS[decoder]))
                    pipelines.append(("imagefolder-local", decoder, functools.partial(_loader, ds, width, batch)))
                    jpegs[decoder] = cached = CachedImageFolder(
                        GCSSource(bucket.name, "flowers/", client), Cache(work / f"c-{width}-{decoder}"),
                        transform=augment(), loader=DECODERS[decoder])
                    pipelines.append(("cache-warm", decoder, functools.partial(_loader, cached, width, batch)))
                once = CachedImageFolder(GCSSource(bucket.name, "flowers/", client), Cache(work / f"c-{width}-once"),
                                         transform=augment(), decode_once=DECODED_SIZE)
                pipelines.append(("decode-once-warm", f"pil@{DECODED_SIZE}", functools.partial(_loader, once, width, batch)))
                decoded: list[Any] = []

                def limit(once: Any = once, decoded: list[Any] = decoded, width: int = width) -> Any:
                    # once is warm now; each image's own compact copy (pixels are a view of their record)
                    decoded += [pixels(once._bytes(i)).clone() for i in range(len(once))]
                    return _loader(InMemoryImages(decoded, once.targets, augment()), width, batch)

                pipelines.append((LIMIT, f"pixels@{DECODED_SIZE}", limit))
                if width == widths[-1]:  # the peers, and decode-once under a budget twice what it holds (reads demote)
                    room = 2 * (len(once) * once.decoded.sample_bytes + once.total_bytes)
                    budgeted = CachedImageFolder(GCSSource(bucket.name, "flowers/", client),
                                                 Cache(work / f"c-{width}-once", max_bytes=room), transform=augment(),
                                                 decode_once=DECODED_SIZE)
                    pipelines.append((BUDGETED, f"pil@{DECODED_SIZE}",
                                      functools.partial(_loader, budgeted, width, batch)))
                    pipelines += _peers(local, work, width, batch, say)
                _interleaved(pipelines, compute, repeats, functools.partial(row, width=width))
                gc.collect()  # litdata's loaders live in a reference cycle: their workers end here, not in a later epoch
                if torch.cuda.is_available():  # the workers read bytes; the GPU decodes and crops each batch
                    on_gpu = CachedImageFolder(GCSSource(bucket.name, "flowers/", client), Cache(work / f"c-{width}-gpu"),
                                               loader=encoded)
                    cold, *warm = _epochs(on_gpu, width, batch, compute, 1 + repeats, on_gpu=True)
                    row("cache-cold", GPU, cold, width)
                    for report in warm:
                        row("cache-warm", GPU, report, width)
                if width == widths[-1]:  # each pipeline's stages on one core, while no worker runs
                    import random

                    some = random.Random(0).sample(range(len(once)), min(200, len(once)))
                    timings: dict[str, Callable[[], dict[str, float]]] = {
                        f"cache-warm {d}": functools.partial(stage_us, ds._bytes, DECODERS[d], augment(), some, batch)
                        for d, ds in jpegs.items()}
                    timings[f"decode-once-warm pil@{DECODED_SIZE}"] = functools.partial(
                        stage_us, once._bytes, pixels, augment(), some, batch)
                    timings[f"{LIMIT} pixels@{DECODED_SIZE}"] = functools.partial(
                        stage_us, decoded.__getitem__, _same, augment(), some, batch)
                    # the median of 3 rounds taken in turns: one pass each once timed a crop at 2.6x its cost
                    for name, runs in interleaved_runs(timings, rounds=3).items():
                        stages[name] = {s: statistics.median(r[s] for r in runs) for s in STAGES}

            width = max(2, min(widths[-1], cpus))
            blobs = [data for _, data in flowers.objects()]
            plain_rates, cold_rates, write_rates = cold_epoch_vs_plain_read(
                blobs, work, width, compute, files=plain_files, repeats=repeats, batch=batch, say=say)
            ahead_rates, alone_rates = mounted_epoch_rates(lab, blobs, work, width, compute,
                                                             files=min(plain_files, 600), repeats=repeats, batch=batch,
                                                             say=say)

    top = widths[-1]
    results = {
        "machine": {"cpus": cpus, "torch_threads": 1}, "where": f"lab:{region}", "images": images, "batch": batch,
        "profile": {"name": profile, "samples_per_s": PROFILES[profile].samples_per_s,
                    "source": PROFILES[profile].source},
        "decode_ms_per_sample": ms_per_sample, "rows": rows,
        "plain_read_files_per_s": plain_rates, "cold_epoch_files_per_s": cold_rates, "cold_epoch_workers": width,
        "copies_written_files_per_s": write_rates,
        "stage_us": stages,
        "mounted_files_per_s": {"prefetching": ahead_rates, "without": alone_rates},
        "mounted_prefetch_gain": (statistics.median(ahead_rates) / statistics.median(alone_rates)
                                  if ahead_rates and alone_rates else None),
        "peers_missing": feedpeers.missing(),
        "goals": {"decode_once_vs_jpeg_warm": ">= 2.0", "decode_once_vs_limit": ">= 0.75",
                  "decode_once_vs_best_peer": "> 1.0", "jpeg_cache_vs_best_peer": ">= 1.0",
                  "cold_epoch_vs_plain_read": ">= 0.8"},
    }
    once, jpeg = ("decode-once-warm", f"pil@{DECODED_SIZE}"), ("cache-warm", "pil")
    by_round = {"decode_once_vs_jpeg_warm": per_round(_rates(rows, *once, top), _rates(rows, *jpeg, top)),
                "decode_once_vs_limit": per_round(_rates(rows, *once, top),
                                                   _rates(rows, LIMIT, f"pixels@{DECODED_SIZE}", top)),
                "cold_epoch_vs_plain_read": per_round(cold_rates, plain_rates),
                # against reading the files and then writing their copies, each at its own measured rate
                "cold_epoch_vs_read_then_write": per_round(cold_rates, [1 / (1 / p + 1 / w) for p, w in
                                                                         zip(plain_rates, write_rates)]),
                "decode_once_vs_best_peer": _vs_best_peer(rows, _rates(rows, *once, top), None, top),
                "budget_vs_none": per_round(_rates(rows, BUDGETED, f"pil@{DECODED_SIZE}", top), _rates(rows, *once, top))}
    jpeg_vs_peers = [r for d in DECODERS if (r := _vs_best_peer(rows, _rates(rows, "cache-warm", d, top), d, top))]
    by_round["jpeg_cache_vs_best_peer"] = min(jpeg_vs_peers, key=statistics.median, default=[])
    results["ratio_rounds"] = by_round  # each ratio of one round's epochs, in round order
    results.update({name: statistics.median(ratios) if ratios else None for name, ratios in by_round.items()})
    say(_table(results, top))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))
    say(f"-> {out}")
    return results


#: The rows of what a user would pick instead (the limit is not one: it is this machine's ceiling).
PEER_READERS = ("imagefolder-local", *feedpeers.PEERS)


def _peers(folder: Path, work: Path, width: int, batch: int, say: Callable[[str], None]) -> list[tuple[str, str, Any]]:
    """The feed's peers (:mod:`benchmarks.feedpeers`) on the same images, workers and augmentation, where
    installed, as :func:`_interleaved` takes them: litdata with every decoder, DALI's CPU pipeline with its own."""
    missing = feedpeers.missing()
    peers: list[tuple[str, str, Any]] = []
    if "litdata" not in missing:
        peers += [("litdata", d, functools.partial(feedpeers.litdata_loader, folder, work, DECODERS[d], augment(), width,
                                                    batch)) for d in DECODERS]
    if "dali-cpu" not in missing:
        peers.append(("dali-cpu", "dali", functools.partial(feedpeers.dali_loader, folder, width, batch)))
    if missing:
        say(f"  {', '.join(missing)}: not installed here, not measured (pip install 'dataferry[feed-peers]')")
    return peers


#: The first epoch of a pipeline through a cache fills it: its row is the cold one.
_COLD = {"cache-warm": "cache-cold", "decode-once-warm": "decode-once-cold"}


def _interleaved(pipelines: list[tuple[str, str, Callable[[], Any]]], compute: Any, repeats: int,
                 row: Callable[[str, str, Any], None]) -> None:
    """Each pipeline (reader, decoder, a call that makes its loader, in order) runs one epoch that warms it up (a
    cache's first epoch fills it: its cold row), then ``repeats`` rounds of one epoch each, in turn, every loader
    keeping its workers: a machine that slows down during the run slows every pipeline alike (run one after
    another, a local ``ImageFolder`` once read 21% slower than the same JPEGs through the cache)."""
    from dataferry.harness.feed import feed

    loaders = []
    for reader, decoder, make in pipelines:
        loader = make()
        first = feed(loader, compute, epochs=1)[0]
        if reader in _COLD:
            row(_COLD[reader], decoder, first)
        loaders.append((reader, decoder, loader))
    for _ in range(repeats):
        for reader, decoder, loader in loaders:
            row(reader, decoder, feed(loader, compute, epochs=1)[0])


def _rates(rows: list[dict], reader: str, decoder: str, width: int) -> list[float]:
    """The samples/s of one pipeline's warm epochs at ``width`` workers, in round order."""
    return [r["samples_per_s"] for r in rows if (r["reader"], r["decoder"], r["workers"]) == (reader, decoder, width)]


def _vs_best_peer(rows: list[dict], ours: list[float], decoder: str | None, width: int) -> list[float]:
    """``ours`` (one pipeline's epochs, in round order) over the fastest peer's in the same rounds (only peers
    decoding with ``decoder``, if given; the fastest by its median), at ``width`` workers; [] when no peer ran."""
    decoders = sorted({r["decoder"] for r in rows} if decoder is None else {decoder})
    peers = [rates for p in PEER_READERS for d in decoders if (rates := _rates(rows, p, d, width))]
    if not peers or not ours:
        return []
    return per_round(ours, max(peers, key=statistics.median))


def _table(results: dict, width: int) -> str:
    lines = ["| reader | decoder | workers | samples/s (median) | AU | waiting | decode ms/sample (1 core; gpu: the GPU's) |",
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
    rates = {f"{reader} {decoder}": statistics.median(r["samples_per_s"] for r in rs)
             for (reader, decoder, workers), rs in seen.items() if workers == width}
    lines += _stage_table(results["stage_us"], rates, width)
    lines.append("")
    if results["peers_missing"]:
        lines.append(f"not measured: {', '.join(results['peers_missing'])} (not installed here: pip install "
                     "'dataferry[feed-peers]', or run make bench-train)")
    for key, goal in results["goals"].items():
        rounds = results["ratio_rounds"][key]
        got = "not measured" if results[key] is None else (
            f"{results[key]:.2f}, the median of {len(rounds)} rounds' ratios ({min(rounds):.2f}-{max(rounds):.2f})")
        lines.append(f"{key}: {got} (goal {goal}; {width} workers)")
    floor = results["ratio_rounds"]["cold_epoch_vs_read_then_write"]
    lines.append(f"cold_epoch_vs_read_then_write: {results['cold_epoch_vs_read_then_write']:.2f} ({min(floor):.2f}-"
                 f"{max(floor):.2f}): epoch 1 over reading the files (plain read, "
                 f"{statistics.median(results['plain_read_files_per_s']):,.0f} files/s) and then writing their copies "
                 f"(alone, made durable: {statistics.median(results['copies_written_files_per_s']):,.0f} files/s), one "
                 "after the other, on this disk")
    budget = results["ratio_rounds"]["budget_vs_none"]
    lines.append(f"budget_vs_none: {results['budget_vs_none']:.2f} ({min(budget):.2f}-{max(budget):.2f}): decode-once's "
                 "warm cache under a budget with room to spare (nothing evicted: it measures each read's demote) over "
                 "the same cache without one")
    gain = results["mounted_prefetch_gain"]
    lines.append(f"mounted_prefetch_gain: {'not measured (no gcsfuse)' if gain is None else f'{gain:.2f}'} (epoch 1 "
                 "from a gcsfuse mount through the cache, with the prefetching sampler over without; "
                 f"{results['cold_epoch_workers']} workers)")
    return "\n".join(lines)
