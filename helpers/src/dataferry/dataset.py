"""PyTorch: a map-style Dataset that reads every sample through a :class:`~dataferry.Cache`.

The dataset lists the source once (sorted by name) and reads those versions: a sample already
cached is read as listed, one replaced at the source before it was cached is read in its new
version (never a mix). Call :meth:`refresh` to pick up every change. It pickles without live clients or connections, so
it works in DataLoader workers under fork and spawn; each worker opens its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset, Sampler

from dataferry.cache import Cache
from dataferry.sources import ChangedAtSource, Entry, Source
from dataferry.stage import Prefetcher

__all__ = ["CachedDataset", "PrefetchingSampler"]


class CachedDataset(Dataset):
    """Sample ``i`` is ``decode(bytes of the i-th object)`` (bytes if ``decode`` is None).

    ``names`` restricts the dataset to those objects, in that order. ``decode`` must be
    picklable (a module-level function) for DataLoader workers under spawn.

        ds = CachedDataset(GCSSource("my-bucket", "train/"), Cache("/content/cache"), decode=decode_jpeg)
        loader = DataLoader(ds, batch_size=64, num_workers=4, sampler=ds.prefetching(RandomSampler(ds)))
    """

    def __init__(self, source: Source, cache: Cache, decode: Callable[[bytes], Any] | None = None,
                 names: Sequence[str] | None = None) -> None:
        self.source, self.cache, self.decode = source, cache, decode
        self._names = list(names) if names is not None else None
        self.entries: list[Entry] = self._list()

    def _list(self) -> list[Entry]:
        if self._names is None:
            return sorted(self.source.list(), key=lambda e: e.name)
        return [self.source.stat(n) for n in self._names]

    def refresh(self) -> None:
        """List the source again, to read objects that changed since."""
        self.entries = self._list()

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> Any:
        entry = self.entries[index]
        try:
            data = self.cache.read(self.source, entry)
        except ChangedAtSource:
            # Replaced since listing and not cached: read the current version rather than fail.
            self.entries[index] = entry = self.source.stat(entry.name)
            data = self.cache.read(self.source, entry)
        return self.decode(data) if self.decode is not None else data

    def prefetching(self, sampler: Sampler[int] | Sequence[int], ahead: int = 64, workers: int = 8) -> PrefetchingSampler:
        """Wrap ``sampler`` so that, as the DataLoader draws indices, the next ``ahead`` samples are
        fetched into the cache in background threads of the main process."""
        return PrefetchingSampler(self, sampler, ahead, workers)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def __repr__(self) -> str:
        return (f"<CachedDataset {len(self)} samples, {self.total_bytes / 1e6:.1f} MB from {self.source!r} "
                f"via {self.cache.root}>")


class PrefetchingSampler(Sampler[int]):
    """Yields the wrapped sampler's indices while keeping the next ``ahead`` of them being fetched."""

    def __init__(self, dataset: CachedDataset, sampler: Sampler[int] | Sequence[int], ahead: int = 64,
                 workers: int = 8) -> None:
        self.dataset, self.sampler, self.ahead, self.workers = dataset, sampler, ahead, workers
        self.prefetcher: Prefetcher | None = None

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        order = list(self.sampler)
        entries = [self.dataset.entries[i] for i in order]
        with Prefetcher(self.dataset.source, self.dataset.cache, entries, self.ahead, self.workers) as pf:
            self.prefetcher = pf
            for position, index in enumerate(order):
                pf.advance(position)
                yield index
