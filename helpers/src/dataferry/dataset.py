"""PyTorch: a map-style Dataset that reads every sample through a :class:`~dataferry.Cache`.

The dataset lists the source once (sorted by name) and reads those versions: a sample already
cached is read as listed, one replaced at the source before it was cached is read in its new
version (never a mix). Call :meth:`refresh` to pick up every change. It pickles without live
clients or connections, so it works in DataLoader workers under fork and spawn; each worker opens
its own. The listing is held as an :class:`~dataferry.sources.EntryTable`: 32 bytes per
object plus its name, version and checksum, in a few flat buffers that forked workers share.
"""

from __future__ import annotations

import io
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset, Sampler

from dataferry.cache import Cache
from dataferry.sources import ChangedAtSource, Entry, EntryTable, Source
from dataferry.stage import Prefetcher

__all__ = ["CachedDataset", "PrefetchingSampler", "SourceDataset"]


class CachedDataset(Dataset):
    """Sample ``i`` is ``decode(bytes of the i-th object)`` (bytes if ``decode`` is None), checked against
    the object's CRC32C on every read (the source's, or the one computed when it was filled; a copy
    damaged on local disk since is read again, never returned): about 13 us per 64 KiB warm read.

    ``names`` restricts the dataset to those objects, in that order. ``decode`` must be
    picklable (a module-level function) for DataLoader workers under spawn. A sample once read is
    demoted in the cache: under a budget, room comes from samples read this epoch before those
    fetched ahead and not yet read.

        ds = CachedDataset(GCSSource("my-bucket", "train/"), Cache("/content/cache"), decode=decode_jpeg)
        loader = DataLoader(ds, batch_size=64, num_workers=4, sampler=ds.prefetching(RandomSampler(ds)))
    """

    def __init__(self, source: Source, cache: Cache, decode: Callable[[bytes], Any] | None = None,
                 names: Sequence[str] | None = None) -> None:
        self.source, self.cache, self.decode = source, cache, decode
        self._names = list(names) if names is not None else None
        self.refresh()

    def refresh(self) -> None:
        """List the source again, to read objects that changed since."""
        if self._names is None:
            self.entries = EntryTable(self.source.list(), sort_by_name=True)
        else:
            self.entries = EntryTable(self.source.stat(n) for n in self._names)
        self._replaced: dict[int, Entry] = {}  # samples found replaced at the source since the listing

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, index: int) -> Entry:
        """Sample ``index``'s object, in the version this dataset reads."""
        index = range(len(self.entries))[index]
        return self._replaced.get(index) or self.entries[index]

    def __getitem__(self, index: int) -> Any:
        entry = self.entry(index)
        try:
            data = self.cache.read_verified(self.source, entry)
        except ChangedAtSource:
            # Replaced since listing and not cached: read the current version rather than fail.
            self._replaced[range(len(self.entries))[index]] = entry = self.source.stat(entry.name)
            data = self.cache.read_verified(self.source, entry)
        if self.cache.max_bytes is not None:  # under a budget: room comes from what this epoch has read
            self.cache.demote(self.source, [entry])
        return self.decode(data) if self.decode is not None else data

    def prefetching(self, sampler: Sampler[int] | Sequence[int], ahead: int | None = None) -> PrefetchingSampler:
        """Wrap ``sampler`` so that, as the DataLoader draws indices, samples up to ``ahead`` past
        the one drawn are fetched into the cache in the background by the main process, at most
        256 at once from a bucket (on its download loop), 32 from a folder (on a few threads);
        ``ahead`` defaults to four times that (see :class:`~dataferry.Prefetcher`). Under a cache budget
        the fills ahead take at most half of it; keep the DataLoader's own read-ahead (``batch_size *
        num_workers * prefetch_factor`` samples) within the other half, or what was fetched for it is
        evicted before it is read."""
        return PrefetchingSampler(self, sampler, ahead)

    @property
    def total_bytes(self) -> int:
        return self.entries.total_bytes + sum(e.size - self.entries[i].size for i, e in self._replaced.items())

    def __repr__(self) -> str:
        return (f"<CachedDataset {len(self)} samples, {self.total_bytes / 1e6:.1f} MB from {self.source!r} "
                f"via {self.cache.root}>")


class SourceDataset(Dataset):
    """Sample ``i`` is ``decode(bytes of entries[i])`` read straight from ``source`` on every access, with no
    cache: what a Dataset over a Drive or gcsfuse mount, or one that downloads in ``__getitem__``, does.
    The course's baseline for every method that pays the remote each epoch."""

    def __init__(self, source: Source, entries: Iterable[Entry], decode: Callable[[bytes], Any] | None = None) -> None:
        self.source, self.decode = source, decode
        self.entries = EntryTable(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> Any:
        buf = io.BytesIO()
        self.source.fetch(self.entries[index], buf)
        data = buf.getvalue()
        return self.decode(data) if self.decode is not None else data

    def __repr__(self) -> str:
        return f"<SourceDataset {len(self)} samples from {self.source!r}, no cache>"


class PrefetchingSampler(Sampler[int]):
    """Yields the wrapped sampler's indices while the ones up to ``ahead`` past the reader are fetched."""

    def __init__(self, dataset: CachedDataset, sampler: Sampler[int] | Sequence[int], ahead: int | None = None) -> None:
        self.dataset, self.sampler, self.ahead = dataset, sampler, ahead
        self.prefetcher: Prefetcher | None = None

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        order = array("q", self.sampler)  # 8 bytes a sample, not a list of ints
        entries = _InOrder(self.dataset, order)
        with Prefetcher(self.dataset.source, self.dataset.cache, entries, self.ahead) as pf:
            self.prefetcher = pf
            for position, index in enumerate(order):
                pf.advance(position)
                yield index


class _InOrder(Sequence):
    """The dataset's entries in a sampler's order, each made only when the prefetcher reaches it."""

    def __init__(self, dataset: CachedDataset, order: array) -> None:
        self.dataset, self.order = dataset, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, position):  # type: ignore[override]
        return self.dataset.entry(self.order[position])
