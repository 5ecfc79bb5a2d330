"""Lesson 04's training runs: a small model trained through the cache from an empty cache, staging first or
caching on first read, each run's epochs timed with :func:`dataferry.harness.feed.feed` and the model scored on
held-out images."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataferry.course.lessondata import LessonData

__all__ = ["MODES", "train_through_cache", "compare_with_2020"]

MODES = ("stage, then train", "cache on first read")


def _compute(repeat: int, seed: int, batch_size: int, image_size: int) -> Any:
    """The model and its training step (a ResNet-18 on a GPU, else a small CNN), its compute-only rate timed
    once outside every clock, then its weights reset the same way for both modes."""
    import torch
    from torch import nn

    from dataferry.harness.feed import TorchCompute, small_cnn

    torch.manual_seed(seed + repeat)
    if torch.cuda.is_available():
        compute = TorchCompute("resnet18", device="cuda")
        compute.model.fc = nn.Linear(compute.model.fc.in_features, 5).to(compute.device)
    else:
        compute = TorchCompute(small_cnn(classes=5), device="cpu", amp=False, channels_last=False)
    compute.warm_up((batch_size, 3, image_size, image_size))
    torch.manual_seed(seed + repeat)
    for layer in compute.model.modules():
        if hasattr(layer, "reset_parameters"):
            layer.reset_parameters()
    compute.optimizer = torch.optim.Adam(compute.model.parameters(), lr=1e-3)  # type: ignore[assignment]
    return compute


def _accuracy(model: Any, dataset: Any, workers: int) -> float:
    import torch
    from torch.utils.data import DataLoader

    model.eval()
    right = 0
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=50, num_workers=workers):
            right += (model(x.to(next(model.parameters()).device).float() / 255).argmax(1).cpu() == y).sum().item()
    model.train()
    return right / len(dataset)


def _downloads(data: LessonData) -> int | None:
    """Media downloads of the training images the lab's server answered so far (None outside the lab)."""
    if data.lab is None:
        return None
    return sum(n for name, n in data.lab.downloads(data.source.bucket).items() if name.startswith(data.source.prefix))


def train_through_cache(data: LessonData, train_tf: Any, test_tf: Any, *, epochs: int, repeats: int, seed: int,
                        batch_size: int, workers: int, image_size: int, caches: Path) -> tuple[Any, float]:
    """Every mode of :data:`MODES` ``repeats`` times, in turns, each from an empty cache under ``caches``: rows
    per epoch (seconds, staging, first batch, waiting, computing, MB/s, where it read from; the run's accuracy
    and, in the lab, the downloads the server answered); and one image's preparation in ms on one core."""
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry import Cache, CachedImageFolder, stage
    from dataferry.harness.bench import interleave
    from dataferry.harness.feed import feed, sample_ms
    from dataferry.harness.pagecache import evict

    def fresh(name: str) -> Cache:
        return Cache(caches / f"{name}-{time.time_ns()}")

    def run(turn: Any) -> list[dict[str, Any]]:
        mode = turn.way
        cache = fresh(mode.split(",")[0].replace(" ", "-"))
        compute = _compute(turn.repeat, seed, batch_size, image_size)
        before = _downloads(data)
        ds = CachedImageFolder(data.source, cache, transform=train_tf, is_valid_file=data.is_train, allow_empty=True)
        stage_s = 0.0
        if mode == MODES[0]:
            stage_s = stage(data.source, cache, ds.entries, progress=False).seconds
            loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                                persistent_workers=workers > 0)
        else:
            loader = DataLoader(ds, batch_size=batch_size, num_workers=workers,
                                sampler=ds.prefetching(RandomSampler(ds)), persistent_workers=workers > 0)
        reads_from = ["network (empty cache)"]

        def between_epochs(epoch: int) -> None:
            if epoch > 1:
                dropped = evict([cache.path(data.source, e) for e in ds.entries])
                reads_from.append(f"local disk ({dropped.cache_state})")

        with data.network():
            reports = feed(loader, compute, epochs=epochs, before_epoch=between_epochs)
        del loader  # stops the worker processes
        rows = []
        for r, where in zip(reports, reads_from):
            first = stage_s if r.epoch == 1 else 0.0
            rows.append({"epoch": r.epoch, "seconds": r.wall_s + first, "stage_s": first,
                         "first_batch_s": r.waits_s[0] + first, "waiting_s": r.wait_s + first,
                         "computing_s": r.compute_s, "MBps": ds.total_bytes / (r.wall_s + first) / 1e6,
                         "reads_from": where})
        test = CachedImageFolder(data.test_source, cache, transform=test_tf, is_valid_file=data.is_test,
                                 allow_empty=True)
        rows[-1]["accuracy"] = _accuracy(compute.model, test, workers)
        after = _downloads(data)
        return [{**r, "samples": len(ds), "downloads": None if before is None or after is None else after - before}
                for r in rows]

    table = interleave(dict.fromkeys(MODES, run), repeats, seed).rename(columns={"way": "mode"})
    timing = CachedImageFolder(data.source, fresh("timing"), transform=train_tf, is_valid_file=data.is_train,
                               allow_empty=True)
    return table, sample_ms(timing)


def compare_with_2020(data: LessonData, n: int, file_bytes: int, folder: Path, repeats: int, seed: int) -> Any:
    """The 2020 post's one-blob-after-another copy (``api-serial``) beside ``transfer_manager`` (``api-parallel``)
    and ``dataferry`` (staging, then reading the cache) on ``n`` files: the lab's random files of ``file_bytes``,
    elsewhere ``n`` of the training images; two passes each (pass 2 a re-read with the page cache dropped)."""
    from dataferry.harness.bench import Target, measure
    from dataferry.harness.runtime import detect_region

    methods = ["dataferry", "api-parallel", "api-serial"]
    if data.lab is not None:
        from dataferry.course.lab.methodsbench import lab_target

        target = lab_target(data.lab, "l04-compare", n, file_bytes, seed=seed)
        with data.network():
            return measure(target, methods, folder, region=detect_region(lab_profile=data.profile), passes=2,
                           repeats=repeats, seed=seed)
    chosen = data.entries[:n]
    source = data.source
    target = Target(names=[e.name for e in chosen], sizes={e.name: e.size for e in chosen},
                    bucket=source._client_here().bucket(source.bucket), prefix=source.prefix, source=source)
    return measure(target, methods, folder, passes=2, repeats=repeats, seed=seed)
