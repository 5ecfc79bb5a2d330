"""Lesson 08's front door and runs: the compute profiles to feed, the same files read every way into them
(AU per epoch), the decoders compared once the files are local, and, on a GPU runtime, a real ResNet-50."""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataferry.course.run import Course

__all__ = ["AUData", "cuda", "compute_profiles", "au_data", "au_runs", "decoding_run", "real_gpu"]


def cuda(real_gpu: str = "auto") -> bool:
    """Whether this runtime trains on a CUDA GPU (``real_gpu = "no"`` emulates only)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available()) and real_gpu != "no"


def compute_profiles(names: list[str], real_gpu: str = "auto", batch_size: int = 64) -> list[Any]:
    """The named profiles (:data:`dataferry.harness.feed.PROFILES`), and with a GPU this runtime's, measured now at
    ``batch_size`` (the lesson's: a GPU's rate per sample depends on it)."""
    from dataferry.harness.feed import PROFILES, measure_profile

    profiles = [PROFILES[name] for name in names]
    if cuda(real_gpu):
        profiles.append(measure_profile("resnet50", batch_size=batch_size, name="resnet50-this-gpu"))
    return profiles


@dataclass
class AUData:
    """The files every way of reading reads (``target``), under which regions (lab profiles, or this runtime's
    region), and the ways that apply here."""

    target: Any
    regions: list[tuple[str | None, Any]]
    methods: list[str]
    work: Path
    about: str
    lab: Any = field(default=None, repr=False)
    images: Any = None

    def __str__(self) -> str:
        return self.about

    def under(self, lab_profile: str | None) -> Any:
        """A ``with`` block under that lab region profile (nothing to switch outside the lab)."""
        return self.lab.using_profile(lab_profile) if self.lab is not None else contextlib.nullcontext()


def au_data(course: Course, n: int, file_bytes: int, methods: list[str], *, seed: int = 0, bucket: str = "",
            prefix: str = "", profiles: list[str] | None = None) -> AUData:
    """In the lab ``n`` files of ``file_bytes`` read under each of ``profiles``; elsewhere a sample of ``n`` files
    of the public flowers (or your ``bucket``/``prefix``) from this runtime's region."""
    work = course.folder("", "au")
    if course.where == "lab":
        from dataferry.course.lab import Lab
        from dataferry.course.lab.methodsbench import lab_target

        lab = Lab().up()
        target = lab_target(lab, "l08-au", n, file_bytes, seed=seed, work=work / "target")
        regions: list[tuple[str | None, Any]] = [(p, course.region(lab_profile=p)) for p in profiles or ["same-continent"]]
        ways = [m for m in methods if target.mount or not m.startswith("gcsfuse")]
        return AUData(target, regions, ways, work, f"{len(target.names)} files of {file_bytes / 2**10:g} KiB in the lab, "
                      f"read under {', '.join(f'lab:{p}' for p, _ in regions)}; ways: {', '.join(ways)}", lab)
    from dataferry.harness.bench import source_target

    cloud = course.cloud_data(bucket, prefix)
    if any(m.startswith("gcsfuse") for m in methods):
        from dataferry import mounts

        mounts.install_gcsfuse()
    target = source_target(cloud.uri, max_files=n, seed=seed, client=cloud.client, suffix=cloud.suffix)
    ways = [m for m in methods if m in ("api", "stage", "cache") or (m.startswith("gcsfuse") and target.mount)]
    from dataferry.course.findings import where_said

    region = course.region()
    return AUData(target, [(None, region)], ways, work, f"{len(target.names)} files of {cloud.uri}, "
                  f"{target.total_bytes / 1e6:.1f} MB, read in {where_said(region.region)}; ways: {', '.join(ways)}")


def au_runs(data: AUData, profiles: list[Any], folder: Path, *, epochs: int, repeats: int, batch_size: int,
            workers: int, seed: int = 0) -> Any:
    """Every way of reading into every compute profile, under every region, ``repeats`` times from a fresh start:
    one ``train`` row per epoch in ``folder``'s ``results.csv`` (:func:`dataferry.harness.utilisation.compare_au`)."""
    from dataferry.harness.runtime import capture
    from dataferry.harness.results import Results, load_results
    from dataferry.harness.utilisation import compare_au

    runtime = capture(str(data.work))
    meta = {"experiment": "au", "runtime": runtime.to_dict(), "seed": seed, "epochs": epochs, "repeats": repeats,
            "batch_size": batch_size, "workers": workers, "methods": data.methods,
            "compute_profiles": {p.name: p.__dict__ for p in profiles}}
    with Results(folder, meta) as results:
        for lab_profile, region in data.regions:
            for p in profiles:
                with data.under(lab_profile):
                    compare_au(data.target, results, data.methods, p, region=region, runtime_kind=runtime.kind,
                               epochs=epochs, repeats=repeats, batch_size=batch_size, workers=workers, seed=seed,
                               work=data.work)
        run_id = results.run_id
    return load_results(folder, run_id=run_id)


def decoding_run(course: Course, data: AUData, n: int, compute_name: str, *, epochs: int, workers: int,
                 batch_size: int, seed: int = 0, real_gpu: str = "auto") -> tuple[Any, str, int]:
    """Flower photos staged into one cache (in the lab, under the first of its region profiles), then the same training
    loop with each way of decoding, their epochs in turns (:func:`dataferry.harness.bench.decoders.compare_decoders`):
    its rows, each with ``where`` it ran, what it fed, and the workers (one per CPU at most: decoding is CPU work)."""
    import pandas as pd

    from dataferry import GCSSource
    from dataferry.harness.bench.decoders import compare_decoders
    from dataferry.harness.feed import PROFILES, EmulatedCompute, TorchCompute

    if data.lab is not None:
        from dataferry.course.lab.flowers import plan_flowers

        photos = data.lab.empty_bucket("l08-flowers")
        plan_flowers(max(1, n // 5), seed=seed, prefix="flowers/").upload(photos)
        source, names = GCSSource("l08-flowers", "flowers/", client=data.lab.client()), None
    else:
        cloud = course.cloud_data()
        source = GCSSource(cloud.bucket, cloud.prefix, client=cloud.client)
        listed = [e.name for e in source.list() if "/" in e.name and e.name.lower().endswith((".jpg", ".jpeg"))]
        names = random.Random(seed).sample(listed, min(n, len(listed)))
    if cuda(real_gpu):
        import torch

        compute: Any = TorchCompute("resnet50")
        compute.warm_up((batch_size, 3, 224, 224))
        fed = f"a real ResNet-50 on {torch.cuda.get_device_name(0)}"
    else:
        profile = PROFILES[compute_name]
        compute = EmulatedCompute(profile)
        fed = f"{compute_name} (emulated: {profile.model} on {profile.accelerator}, {profile.samples_per_s:.0f} images/s)"
    width = min(workers, os.cpu_count() or 1)
    lab_profile, region = data.regions[0]
    with data.under(lab_profile):
        rows = compare_decoders(source, data.work / f"decoders-{time.time_ns()}", compute, workers=width,
                                batch_size=batch_size, epochs=epochs, names=names, seed=seed, say=lambda line: None)
    return pd.DataFrame(rows).assign(where=region.region), fed, width


def real_gpu(data: AUData, profile: Any, *, epochs: int, workers: int, batch_size: int, real: str = "auto") -> Any:
    """On a CUDA runtime: a real ResNet-50 trained through the cache beside the emulator's prediction with this
    GPU's measured ``profile``, at the lesson's ``batch_size`` (with its files, an epoch then runs past the
    pipeline's fill and has a steady state); a row per mode and epoch, with where it ran and the state the epoch
    started in (before each later epoch the cache's copies are dropped from the page cache, as the ways of reading
    above were). None (said) without a GPU."""
    if not cuda(real):
        print("No CUDA GPU here: the accelerator was emulated only. In Colab, choose a GPU runtime and run again "
              "to train a real model through the cache.")
        return None
    import pandas as pd
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry import Cache, CachedDataset
    from dataferry.harness.feed import EmulatedCompute, TorchCompute, feed, image_sample
    from dataferry.harness.pagecache import evict
    from dataferry.harness.utilisation import epoch_state

    resnet = TorchCompute("resnet50")
    resnet.warm_up((batch_size, 3, 224, 224))
    lab_profile, region = data.regions[0] if data.regions else (None, None)
    rows = []
    for mode, compute in (("real GPU", resnet), ("emulated", EmulatedCompute(profile))):
        cache = Cache(data.work / f"gpu-{mode.replace(' ', '-')}-{time.time_ns()}")  # empty: a rerun starts cold too
        ds = CachedDataset(data.target.source, cache, decode=image_sample)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, pin_memory=True, persistent_workers=True,
                            sampler=ds.prefetching(RandomSampler(ds)))
        entries = [ds.entry(i) for i in range(len(ds))]
        states: list[str] = []

        def before(epoch: int, cache: Any = cache, ds: Any = ds, entries: list[Any] = entries,
                   states: list[str] = states) -> None:
            copies = [cache.path(ds.source, e) for e in entries if epoch > 1 and cache.contains(ds.source, e)]
            states.append(epoch_state("cache", epoch, evict(copies).cache_state) if copies else "cold_verified")

        with data.under(lab_profile):
            for r in feed(loader, compute, epochs=epochs, before_epoch=before):
                rows.append({"mode": mode, "where": getattr(region, "region", "unknown"), "epoch": r.epoch,
                             "cache state": states[r.epoch - 1], "AU": r.au, "steady AU": r.steady_au,
                             "samples/s": r.samples_per_s, "bound by": r.bound_by})
    return pd.DataFrame(rows)
