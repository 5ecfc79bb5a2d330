"""dataferry: get training data from cloud storage to the GPU fast, the first time and every epoch.

Data flows one way: **source -> stage -> cache -> dataset -> DataLoader -> model**.

Two ways to use the cache, side by side::

    from dataferry import Cache, GCSSource, CachedDataset, stage

    source = GCSSource("my-bucket", "train/")            # or LocalSource("/content/drive/MyDrive/train")
    cache = Cache("/content/cache", max_bytes=40e9)      # local disk, verified, crash-safe

    # 1. stage everything, then train: one parallel pass over the bucket, then local-disk epochs
    stage(source, cache)
    ds = CachedDataset(source, cache, decode=my_decode)

    # 2. cache on first read: epoch 1 reads through (prefetching ahead), later epochs are local
    ds = CachedDataset(source, cache, decode=my_decode)
    loader = DataLoader(ds, batch_size=64, num_workers=4, sampler=ds.prefetching(RandomSampler(ds)))

Stage first when the data fits on local disk and you want epoch 1 to run at full speed; cache
on first read when you want to start training at once, or the data only partly fits (the LRU
budget keeps the most recently used part).

Modules, lowest floor first: ``errors`` (the one error root, ``DataferryError``), ``host`` (is a process alive, is this Colab, what is mounted where), ``progress`` (progress bars), ``aio`` (the
process's download loop), ``gcs_media`` (GCS media downloads over aiohttp), ``sources`` (where
bytes live), ``mounts`` (gcsfuse, Drive and the Colab helpers), ``runtime`` (what we run on,
which region), ``cache`` (the local cache: a package, ``Cache`` its face), ``stage`` (parallel
staging, prefetch), ``dataset`` (PyTorch), ``shards`` (tar shards streamed through the cache under
its budget, and making them), ``checkpoints`` (checkpoints that survive a disconnect), ``timing`` (cache-state control, timed reads, result
files), ``stats`` (medians, bootstrap intervals), ``plots`` (the standard figures), ``bench``
(ready-made experiments), ``course`` (the lessons' choices: which data, where results go, what
the setup cell installs), ``analysis`` (the analysis lesson's pooling and findings), ``lab`` (the offline cloud for tests and lessons), ``cli`` (the
``dataferry`` command).
Names are imported lazily, so ``import dataferry`` needs neither torch nor a network.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Source": "dataferry.sources", "Entry": "dataferry.sources", "LocalSource": "dataferry.sources",
    "GCSSource": "dataferry.sources", "SourceError": "dataferry.sources",
    "Cache": "dataferry.cache", "CacheStats": "dataferry.cache", "ChecksumError": "dataferry.cache",
    "CacheFullWarning": "dataferry.cache",
    "Prefetcher": "dataferry.stage", "StageReport": "dataferry.stage",
    "CachedDataset": "dataferry.dataset", "CachedImageFolder": "dataferry.dataset", "ShardDataset": "dataferry.shards", "ShardLoader": "dataferry.shards",
    "make_shards": "dataferry.shards",
    "Checkpoints": "dataferry.checkpoints", "CheckpointError": "dataferry.checkpoints",
    "DataferryError": "dataferry.errors", "BadArgument": "dataferry.errors",
}
__all__ = ["__version__", "stage", *_EXPORTS]

# Eager, because the function shares its name with its module: importing the module later would
# otherwise leave ``dataferry.stage`` bound to the module instead of the function.
from dataferry.stage import stage  # noqa: E402


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dataferry' has no attribute {name!r}")
