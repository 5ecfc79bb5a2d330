"""After the cache: what decoding costs a training epoch, decoder by decoder, and what decode-once buys.

Once the images are on local disk, a DataLoader worker spends its time decoding and augmenting them
(see :mod:`dataferry.decode`). :func:`compare_decoders` stages a folder of images (``<class>/<file>.jpg``,
as ``ImageFolder`` reads) into one cache, then runs the same training loop with each decoder: a
:class:`~dataferry.CachedImageFolder` with that ``loader``, the usual augmentation (a random resized crop
and a flip), a real ``DataLoader`` with ``workers`` processes, into ``compute`` (an emulated accelerator
or a real model). The decoders take their epochs in turns, each loader keeping its workers (so decoders x
``workers`` processes live through the run, idle but for their turn), so that a machine that slows down during the
run slows them alike. Decode-once (:class:`~dataferry.decode.DecodedImages`) takes its
first epoch after the decoders' first: it decodes into the cache; later ones crop the decoded pixels. When ``compute`` trains on a CUDA GPU, a
``gpu`` row runs too: the workers only read bytes and the GPU decodes each batch
(:class:`~dataferry.ondevice.DecodeOnDevice`); and, last, a ``decode-once@<size> gpu`` row: the workers only read
the pixels decode-once cached and the GPU crops them (:class:`~dataferry.ondevice.CropOnDevice`). Each row is one
epoch: samples/s, AU, the share of wall time the step waited for data, the cache state, the mean bytes on disk of the
files it read (``bytes_per_sample``: JPEGs, or decode-once's decoded pictures), and the decoder's
milliseconds per image on one core (read from the page cache, decode, augment; for the ``gpu`` rows, on the GPU in
a batch: decode or move, then crop).
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import random
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dataferry.cache import Cache
from dataferry.decode import DECODERS, DecodedImages, decode_image, pixels
from dataferry.ondevice import CropOnDevice, DecodeOnDevice, collate_encoded, collate_pixels, encoded
from dataferry.errors import BadArgument
from dataferry.sources import Source

__all__ = ["COST_ROUNDS", "GPU", "STAGES", "augment", "compare_decoders", "decode_ms", "decoder_gains",
           "device_crop_ms", "device_decode_ms", "interleaved_costs", "interleaved_runs", "on_gpu", "stage_us"]

T = TypeVar("T")

#: The decoder name of decoding on the GPU (:class:`~dataferry.decode.DecodeOnDevice`), beside :data:`DECODERS`.
GPU = "gpu"


def on_gpu(decoder: str) -> bool:
    """Whether a row of :func:`compare_decoders` crops on the GPU (``gpu``, ``decode-once@256 gpu``): its
    ``decode_ms_per_sample`` is the GPU's, per image of a batch, not a CPU core's."""
    return decoder == GPU or decoder.endswith(f" {GPU}")


def augment(crop: int = 224) -> Any:
    """The usual training augmentation, for a PIL image or a uint8 tensor, ending in a uint8 tensor (the
    model's step scales it): ``RandomResizedCrop(crop)`` (:class:`dataferry.crops.RandomResizedCrop`:
    torchvision's, the same pixels in less time), then a random horizontal flip."""
    import torch
    from torchvision.transforms import v2

    from dataferry.crops import RandomResizedCrop

    return v2.Compose([v2.ToImage(), RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.uint8)])


def decode_ms(blobs: Sequence[bytes], decoder: Callable[[bytes], Any], transform: Callable[[Any], Any]) -> float:
    """Milliseconds per image on this core: decode ``blobs`` (already in memory) with ``decoder``, then
    ``transform``; one untimed pass first."""
    for data in blobs[:4]:
        transform(decoder(data))
    t0 = time.perf_counter()
    for data in blobs:
        transform(decoder(data))
    return (time.perf_counter() - t0) / len(blobs) * 1e3


#: The stages of a sample's time in a DataLoader worker, as :func:`stage_us` times them.
STAGES = ("read", "decode", "augment", "collate")


def stage_us(read: Callable[[int], Any], decode: Callable[[Any], Any], transform: Callable[[Any], Any],
             indices: Sequence[int], batch: int) -> dict[str, float]:
    """Microseconds per sample on this core, stage by stage (:data:`STAGES`), as a worker spends them: ``read(i)``
    (through the cache: open, read, CRC32C check), ``decode`` (a JPEG decoder, or the view of decoded pixels),
    ``transform`` (the augmentation) and the default collation of ``batch`` samples into one batch. Each stage is
    timed over every sample of ``indices`` (one untimed sample first), in order, the page cache warm."""
    from torch.utils.data import default_collate

    def timed(f: Callable[[Any], Any], items: Sequence[Any]) -> tuple[float, list[Any]]:
        f(items[0])
        t0 = time.perf_counter_ns()
        out = [f(x) for x in items]
        return (time.perf_counter_ns() - t0) / len(items) / 1e3, out

    read_us, data = timed(read, indices)
    decode_us, images = timed(decode, data)
    augment_us, samples = timed(transform, images)
    batches = [[(x, 0) for x in samples[i:i + batch]] for i in range(0, len(samples) - batch + 1, batch)] or [
        [(x, 0) for x in samples]]
    collate_us, _ = timed(default_collate, batches)
    return {"read": read_us, "decode": decode_us, "augment": augment_us, "collate": collate_us / len(batches[0])}


def device_decode_ms(blobs: Sequence[bytes], crop: int = 224, device: str = "cuda") -> float:
    """Milliseconds per image to decode ``blobs`` (JPEGs) in one batch on ``device`` and crop and flip each
    there (:class:`~dataferry.ondevice.DecodeOnDevice`); one untimed batch first."""
    batch = collate_encoded([(encoded(data), 0) for data in blobs])
    return _device_ms(DecodeOnDevice([batch], crop, device), len(blobs))


def device_crop_ms(records: Sequence[bytes], crop: int = 224, device: str = "cuda") -> float:
    """Milliseconds per image to move decode-once's ``records`` in one batch to ``device`` and crop and flip each
    there (:class:`~dataferry.ondevice.CropOnDevice`); one untimed batch first."""
    return _device_ms(CropOnDevice([collate_pixels([(pixels(r), 0) for r in records])], crop, device), len(records))


def _device_ms(on_device: CropOnDevice, images: int) -> float:
    import torch

    sync = torch.cuda.synchronize if on_device.device.type == "cuda" else (lambda: None)
    for _ in range(2):
        sync()
        t0 = time.perf_counter()
        next(iter(on_device))
        sync()
    return (time.perf_counter() - t0) / images * 1e3


#: How many times each decoder's cost on one core is measured, in turns.
COST_ROUNDS = 5


def interleaved_costs(cost_of: dict[str, Callable[[], float]], rounds: int = COST_ROUNDS,
                      seed: int = 0) -> dict[str, float]:
    """Each decoder's milliseconds per image: the median of ``rounds`` measurements taken in turns, in an order
    shuffled anew each round, while no worker runs, so a slow minute of the machine falls on every decoder
    alike rather than on whichever was measured last (one pass each, in a fixed order, made the costs rise
    in measurement order)."""
    import statistics

    return {name: statistics.median(values) for name, values in interleaved_runs(cost_of, rounds, seed).items()}


def interleaved_runs(run_of: dict[str, Callable[[], T]], rounds: int, seed: int = 0) -> dict[str, list[T]]:
    """``rounds`` results of each of ``run_of``'s callables, called in turns, in an order shuffled anew each round
    (what :func:`interleaved_costs` takes the median of)."""
    rng, got = random.Random(seed), {name: list[T]() for name in run_of}
    for _ in range(rounds):
        order = list(run_of)
        rng.shuffle(order)
        for name in order:
            got[name].append(run_of[name]())
    return got


def _named(names: frozenset[str], name: str) -> bool:
    return name in names


def compare_decoders(source: Source, work: str | os.PathLike[str], compute: Any, *, workers: int, batch_size: int,
                     epochs: int = 3, decoders: Sequence[str] | None = None, decode_once: int | None = 256,
                     crop: int = 224, names: Collection[str] | None = None, seed: int = 0,
                     drop_page_cache: bool = True, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One training loop per decoder over the images of ``source`` (only ``names``, if given), all read from
    one cache under ``work``, staged first. Returns a row per epoch (see the module's docstring), decoder by decoder;
    the epochs ran in turns. Epoch 1 of each decoder starts its workers; later epochs are what a long training run
    sees. ``decoders``
    (default: every one of :data:`DECODERS`, and :data:`GPU` when ``compute`` trains on a CUDA GPU).
    ``drop_page_cache``: each epoch reads the cache's copies from the disk (the default: a data set larger than
    memory), or from wherever the epoch before left them (False: one that fits in memory)."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry.dataset import CachedImageFolder
    from dataferry.harness.feed import feed
    from dataferry.staging import stage
    from dataferry.harness.pagecache import evict, residency_state

    on_cuda = getattr(compute, "mode", None) == "cuda"
    decoders = list(DECODERS) + ([GPU] if on_cuda else []) if decoders is None else list(decoders)
    unknown = [d for d in decoders if d not in (*DECODERS, GPU)]
    if unknown:
        raise BadArgument(f"decoders={unknown}: choose from {', '.join((*DECODERS, GPU))}")
    if GPU in decoders and not on_cuda:
        raise BadArgument(f"decoders={decoders}: {GPU!r} decodes on the GPU the model trains on; give a compute "
                          "that trains on CUDA (TorchCompute on a GPU runtime), or leave it out")
    if type(epochs) is not int or epochs < 1:
        raise BadArgument(f"epochs={epochs!r}: give a whole number >= 1")
    valid = functools.partial(_named, frozenset(names)) if names is not None else None
    cache = Cache(Path(work) / "cache")
    tf = augment(crop)
    listed = CachedImageFolder(source, cache, transform=tf, is_valid_file=valid)
    staged = stage(source, cache, listed.entries, progress=False)
    say(f"{len(listed)} images ({listed.total_bytes / 1e6:.1f} MB) staged in {staged.seconds:.1f} s; "
        f"{workers} workers, batch {batch_size}, {os.cpu_count()} CPUs")
    some = random.Random(seed).sample(range(len(listed)), min(64, len(listed)))
    blobs = [cache.read(source, listed.entry(i)) for i in some]
    # One listing, a dataset per decoder; each one's cost on one core, timed before any worker process runs.
    runs: dict[str, Any] = {}
    cost_of: dict[str, Callable[[], float]] = {}
    for name in decoders:
        runs[name] = copy.copy(listed)
        if name == GPU:  # the workers read bytes; DecodeOnDevice decodes and augments on the GPU
            runs[name].loader, runs[name].transform = encoded, None
            cost_of[name] = functools.partial(device_decode_ms, blobs, crop, str(compute.device))
            continue
        runs[name].loader = DECODERS[name]
        cost_of[name] = functools.partial(decode_ms, blobs, DECODERS[name], tf)
    once, once_on_gpu = f"decode-once@{decode_once}", f"decode-once@{decode_once} {GPU}"
    if decode_once:
        runs[once] = copy.copy(listed)
        runs[once].decoded = DecodedImages(source, cache, decode_once)
        decoded = [decode_image(data, decode_once) for data in blobs]
        cost_of[once] = functools.partial(decode_ms, decoded, pixels, tf)
        if GPU in decoders:  # the workers read the pixels decode-once keeps; CropOnDevice crops them on the GPU
            runs[once_on_gpu] = copy.copy(runs[once])
            runs[once_on_gpu].transform = None
            cost_of[once_on_gpu] = functools.partial(device_crop_ms, decoded, crop, str(compute.device))
    ms_per_image = interleaved_costs(cost_of, COST_ROUNDS, seed)
    # what the workers hand over, and what crops it on the GPU, for the rows that crop there
    on_device = {GPU: (collate_encoded, DecodeOnDevice), once_on_gpu: (collate_pixels, CropOnDevice)}
    who = compute.profile.name if hasattr(compute, "profile") else repr(compute)
    loaders: dict[str, Any] = {}
    for name, ds in runs.items():
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
        collate, crops_on_device = on_device.get(name, (None, None))
        loaders[name] = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers,
                                   persistent_workers=workers > 0, collate_fn=collate,
                                   pin_memory=on_cuda and torch.cuda.is_available())
        if crops_on_device is not None:
            loaders[name] = crops_on_device(loaders[name], crop, str(compute.device))
    rows: list[dict[str, Any]] = []

    def one_epoch(name: str, epoch: int) -> None:
        """One epoch of ``name``'s loader: where its files are first (outside the clock), then its row and line."""
        ds = runs[name]
        if name == once and epoch == 1:  # it reads the JPEGs and decodes them into the cache
            files, state = [cache.path(source, e) for e in ds.entries], "decoding into the cache"
        else:
            files = ([cache.path(ds.decoded, ds.decoded.entry(e)) for e in ds.entries] if ds.decoded is not None else
                     [cache.path(source, e) for e in ds.entries])
            state = ""
        size = sum(os.stat(f).st_blocks * 512 for f in files) / len(files)  # the mean bytes on disk it reads
        if not state:  # MEASUREMENT.md's names: the copies, dropped from the page cache; else what mincore finds left
            dropped = drop_page_cache and evict(files).cache_state == "cold_verified"
            state = "local_copy" if dropped else residency_state(files)
        report = feed(loaders[name], compute, epochs=1)[0]
        rows.append({"decoder": name, "epoch": epoch, "samples_per_s": report.samples_per_s, "au": report.au,
                     "steady_au": report.steady_au, "wait_share": report.wait_s / report.wall_s,
                     "epoch_s": report.wall_s, "cache_state": state, "bytes_per_sample": size,
                     "decode_ms_per_sample": ms_per_image[name], "workers": workers, "cpus": os.cpu_count(),
                     "compute": who})
        say(f"  {name:22} epoch {epoch}: {report.samples_per_s:6.0f} samples/s, AU {report.au:4.0%}, "
            f"waiting {report.wait_s / report.wall_s:4.0%} ({state})")

    # The decoders take their epochs in turns, each loader keeping its workers, so that a machine slowing down
    # during the run slows them alike (one after another, a decoder once ran 1.18x PIL [95% CI 1.02, 1.25] in one run
    # and 0.79x [0.75, 0.91] in the next). Epoch 1 in order (decode-once decodes before its GPU row reads what it
    # decoded); each later round starts one further along, so that none always runs first.
    order = list(runs)
    for epoch in range(1, epochs + 1):
        at = (epoch - 1) % len(order)
        for name in order if epoch == 1 else order[at:] + order[:at]:
            one_epoch(name, epoch)
    loaders.clear()
    gc.collect()  # the workers go now
    return sorted(rows, key=lambda r: (order.index(r["decoder"]), r["epoch"]))


def decoder_gains(rows: Sequence[dict[str, Any]], baseline: str = "pil") -> dict[str, tuple[float, float, float]]:
    """Each decoder's samples/s after epoch 1 over ``baseline``'s, as (ratio of medians, 95% CI low, high):
    what each fix buys, and whether the run can tell it from nothing (a CI that straddles 1 cannot)."""
    from dataferry.harness.stats import speedup

    later: dict[str, list[float]] = {}
    for r in rows:
        if r["epoch"] > 1:
            later.setdefault(r["decoder"], []).append(r["samples_per_s"])
    if baseline not in later:
        raise BadArgument(f"no epoch after the first of {baseline!r} in these rows: run epochs >= 2 with it")
    return {d: speedup(v, later[baseline]) for d, v in later.items()}
