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

Three blocks, each importing only those before it:

- **the library** a training script imports, in this folder, lowest floor first: ``errors`` (the one error
  root, ``DataferryError``), ``host`` (is a process alive, is this Colab, what is mounted where), ``progress``
  (progress bars), ``aio`` (the process's download loop), ``gcs_media`` (GCS media downloads over aiohttp),
  ``sources`` (where bytes live), ``mounts`` (gcsfuse, Drive and the Colab helpers), ``cache`` (the local
  cache: a package, ``Cache`` its face), ``staging`` (``stage``: parallel staging; prefetch), ``dataset`` and ``decode``
  (PyTorch), ``shards`` (tar shards streamed through the cache under its budget, and making them),
  ``checkpoints`` (checkpoints that survive a disconnect);
- **the harness** (``dataferry.harness``): honest timings, tidy results and the standard figures;
- **the course** (``dataferry.course``): the lessons' front door, their helpers and findings, the analysis,
  the offline lab and the ``dataferry`` command.

The benchmarks against peers live outside the package, in the repository's ``benchmarks/``. Names are
imported lazily, so ``import dataferry`` needs neither torch nor a network.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # names imported lazily (below), for type checkers
    from dataferry.staging import stage  # noqa: F401

__version__ = "0.1.0"

_EXPORTS = {
    "Source": "dataferry.sources", "Entry": "dataferry.sources", "LocalSource": "dataferry.sources",
    "GCSSource": "dataferry.sources", "SourceError": "dataferry.sources",
    "Cache": "dataferry.cache", "CacheStats": "dataferry.cache", "ChecksumError": "dataferry.cache",
    "CacheFullWarning": "dataferry.cache",
    "stage": "dataferry.staging", "Prefetcher": "dataferry.staging", "StageReport": "dataferry.staging",
    "CachedDataset": "dataferry.dataset", "CachedImageFolder": "dataferry.dataset", "ShardDataset": "dataferry.shards", "ShardLoader": "dataferry.shards",
    "make_shards": "dataferry.shards",
    "Checkpoints": "dataferry.checkpoints", "CheckpointError": "dataferry.checkpoints",
    "DataferryError": "dataferry.errors", "BadArgument": "dataferry.errors",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dataferry' has no attribute {name!r}")


#: Modules that moved into the harness and course blocks, by their old names (``dataferry.<old>``); ``timing``
#: was split by idea, and its old name reads through all three parts.
_MOVED = {**{name: (f"dataferry.harness.{name}",) for name in
             ("stats", "plots", "bench", "feed", "utilisation", "runtime", "folders")},
          "timing": ("dataferry.harness.timing", "dataferry.harness.pagecache", "dataferry.harness.results"),
          "stage": ("dataferry.staging",),
          **{name: (f"dataferry.course.{name}",) for name in
             ("analysis", "shipped", "clientdemos", "disconnect", "cli", "findings", "lab", "lessonau", "lessondata",
              "lessondrive", "lessonfiles", "lessonlayouts", "lessonshards", "lessontraining")}}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import dataferry.timing`` and the other old paths of :data:`_MOVED` keep working for one release: each
    gives a module that reads through to the new ones, with a FutureWarning (shown in a notebook, where a
    DeprecationWarning raised inside the import system would not be)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != "dataferry" or parts[1] not in _MOVED:
            return None
        new = ", ".join(".".join([module, *parts[2:]]) for module in _MOVED[parts[1]])
        return importlib.util.spec_from_loader(fullname, self, origin=new)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        new = module.__spec__.origin if module.__spec__ else None
        assert new is not None
        warnings.warn(f"{module.__name__} moved to {new}: import it from there (the old path goes in the next "
                      "release)", FutureWarning, stacklevel=2)
        real = [importlib.import_module(name) for name in new.split(", ")]
        for part in reversed(real):
            module.__dict__.update({k: v for k, v in vars(part).items() if not k.startswith("__")})

        def read_through(name: str) -> Any:
            for part in real:
                if hasattr(part, name):
                    return getattr(part, name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        module.__getattr__ = read_through  # type: ignore[method-assign]
        if module.__name__ == "dataferry.stage":  # importing it binds ``dataferry.stage`` to it: still the function
            module.__class__ = _CallsStage
        if hasattr(real[0], "__path__"):
            module.__path__ = []  # a package: its submodules come through here too


class _CallsStage(ModuleType):
    """The old module ``dataferry.stage``, which is also the name of the function :func:`dataferry.staging.stage`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("dataferry.staging").stage(*args, **kwargs)


sys.meta_path.append(_OldPaths())
