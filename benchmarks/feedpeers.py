"""The feed's peers in ``make bench-train``: what a user would pick instead of the cache and decode-once, on the
same images, workers and augmentation.

- **litdata** (Lightning's optimised format): the JPEGs' bytes written once into chunks by
  ``litdata.optimize``, read by its ``StreamingDataLoader``, decoded every epoch by the same decoder and augmented
  by the same transform as the cache's rows.
- **NVIDIA DALI's CPU pipeline**: its file reader, its decoder that decodes only the random crop
  (``fn.decoders.image_random_crop``, RandomResizedCrop's area and ratio), an antialiased resize and a random flip,
  on as many threads as the others have workers.

Each is used only where installed (the ``feed-peers`` extra, which ``make bench-train`` installs); otherwise
:func:`missing` says which, and the benchmark runs without its rows.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable
from unittest import mock

__all__ = ["PEERS", "missing", "litdata_loader", "dali_loader"]

#: The feed's peers, by the module each needs.
PEERS = {"litdata": "litdata", "dali-cpu": "nvidia.dali"}


def missing() -> list[str]:
    """The peers whose package is not installed here."""
    gone = []
    for name, module in PEERS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            gone.append(name)
    return gone


def _item(entry: tuple[str, int]) -> dict[str, Any]:
    path, target = entry
    return {"image": Path(path).read_bytes(), "label": target}


class _DecodeAugment:
    """litdata's per-item transform: the JPEG's bytes through ``decode``, then ``transform``; picklable."""

    def __init__(self, decode: Callable[[bytes], Any], transform: Callable[[Any], Any]) -> None:
        self.decode, self.transform = decode, transform

    def __call__(self, item: dict[str, Any]) -> tuple[Any, int]:
        return self.transform(self.decode(bytes(item["image"]))), item["label"]  # litdata gives a memoryview


def litdata_loader(folder: Path, work: Path, decode: Callable[[bytes], Any], transform: Callable[[Any], Any],
                   workers: int, batch: int) -> Any:
    """A litdata ``StreamingDataLoader`` over the images of ``folder`` (optimised once under ``work``), shuffled
    each epoch, each image decoded by ``decode`` and augmented by ``transform`` in its ``workers`` workers."""
    import litdata

    out = work / "litdata"
    if not (out / "index.json").exists():
        from torchvision.datasets import ImageFolder

        scratch = {"DATA_OPTIMIZER_CACHE_FOLDER": str(work / "litdata-chunks"),  # not the system's temp folder
                   "DATA_OPTIMIZER_DATA_CACHE_FOLDER": str(work / "litdata-data")}
        start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            with mock.patch.dict(os.environ, scratch):
                litdata.optimize(fn=_item, inputs=ImageFolder(str(folder)).samples, output_dir=str(out),
                                 chunk_bytes="16MB", num_workers=1, verbose=False)
        finally:  # optimize sets the process's start method to spawn for good: every later DataLoader's workers
            multiprocessing.set_start_method(start_method, force=True)  # then started slower (epoch 1 at 0.2x)
    dataset = litdata.StreamingDataset(str(out), shuffle=True, transform=_DecodeAugment(decode, transform))
    return litdata.StreamingDataLoader(dataset, batch_size=batch, num_workers=workers,
                                       persistent_workers=workers > 0)


class _DaliBatches:
    """A DALI iterator as ``(images, targets)`` batches, one pass per ``iter()`` (as a DataLoader's epochs)."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for out in self.iterator:
            yield out[0]["images"], out[0]["labels"].squeeze(-1)


def dali_loader(folder: Path, threads: int, batch: int, crop: int = 224, seed: int = 0) -> Any:
    """NVIDIA DALI's CPU pipeline over the images of ``folder``: shuffled, each decoded only within a random
    resized crop (RandomResizedCrop's default area 0.08-1 and ratio 3/4-4/3), resized to ``crop`` x ``crop``
    (antialiased), flipped at random; ``N x 3 x crop x crop`` uint8 batches, on ``threads`` CPU threads."""
    import nvidia.dali as dali_module
    import nvidia.dali.fn
    import nvidia.dali.types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    dali: Any = dali_module  # typed loosely: DALI's stubs, where installed, do not describe its operators
    fn, types = dali.fn, dali.types

    @dali.pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
    def pipeline() -> Any:
        jpegs, labels = fn.readers.file(file_root=str(folder), random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=crop, resize_y=crop, antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return fn.transpose(images, perm=[2, 0, 1]), labels

    pipe = pipeline()
    pipe.build()
    return _DaliBatches(DALIGenericIterator(pipe, ["images", "labels"], reader_name="reader", auto_reset=True,
                                            last_batch_policy=LastBatchPolicy.PARTIAL))
