"""PyTorch: an IterableDataset of tar shards streamed through the verified cache.

Each epoch is a pure function of (seed, epoch, rank, world size, worker, workers): a seeded shuffle of
the shard order, every shard given to exactly one (rank, worker), and a seeded shuffle buffer that
mixes samples within and across that worker's shards. While a worker reads shard k, its next
``ahead`` shards download in the background; a shard read this epoch is demoted in the cache, so
when the budget needs room it goes first and shards kept from the last epoch stay until read.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from dataferry.cache import Cache
from dataferry.shards.tar import samples
from dataferry.sources import EntryTable, Source

__all__ = ["ShardDataset"]


def _ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): as given, else torch.distributed's when it is set up, else torchrun's
    environment, else (0, 1)."""
    if rank is not None or world_size is not None:
        rank, world_size = rank or 0, world_size or 1
    else:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank, world_size


class ShardDataset(IterableDataset):
    """Samples ``{"__key__": ..., "__url__": shard, "jpg": bytes, ...}`` (through ``decode`` if given: a
    function of the sample dict, e.g. a ``webdataset.Decoder``) from tar shards in ``source``, read
    through ``cache``. ``shards`` picks some (default: every ``.tar`` under the source, by name).
    ``shuffle`` is the shuffle buffer in samples (0: shard order only). Call :meth:`set_epoch`
    before each epoch, as with ``DistributedSampler``.

        ds = ShardDataset(GCSSource("my-bucket", "shards/"), Cache("/content/cache", max_bytes=50e9))
        for epoch in range(3):
            ds.set_epoch(epoch)
            for batch in DataLoader(ds, batch_size=64, num_workers=4): ...
    """

    def __init__(self, source: Source, cache: Cache, shards: Sequence[str] | None = None, *,
                 decode: Callable[[dict], Any] | None = None, shuffle: int = 1000, seed: int = 0, ahead: int = 2,
                 rank: int | None = None, world_size: int | None = None) -> None:
        self.source, self.cache, self.decode = source, cache, decode
        self.shuffle, self.seed, self.ahead = shuffle, seed, ahead
        self.rank, self.world_size = _ranks(rank, world_size)
        listed = (sorted((e for e in source.list() if e.name.endswith(".tar")), key=lambda e: e.name)
                  if shards is None else [source.stat(n) for n in shards])
        if not listed:
            raise FileNotFoundError(f"no .tar shards in {getattr(source, 'uri', source)}: check the path, or make "
                                    "them with `dataferry shards make`")
        self.shards = EntryTable(listed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads: it sets the shard order and the shuffle."""
        self.epoch = epoch

    def plan(self, worker: int = 0, workers: int = 1, epoch: int | None = None) -> list[int]:
        """The shards (indices into :attr:`shards`) that this rank's ``worker`` of ``workers`` reads in
        ``epoch``, in order. Over all ranks and workers, every shard exactly once."""
        order = list(range(len(self.shards)))
        random.Random(f"{self.seed}:{self.epoch if epoch is None else epoch}").shuffle(order)
        slots = self.world_size * workers
        return order[self.rank * workers + worker::slots]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = [self.shards[i] for i in self.plan(worker, workers)]
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}")
        buffer: list[dict] = []
        fills: dict[int, list[Future]] = {}  # position -> its background fill
        try:
            for position, entry in enumerate(mine):
                for ahead in range(position, min(len(mine), position + self.ahead + 1)):
                    if ahead not in fills:
                        fills[ahead] = self.cache.fill_later(self.source, [mine[ahead]])
                # Wait for this shard's own fill rather than race it: a fill still queued when the reader
                # had passed would download the shard a second time once evicted.
                wait(fills.pop(position))
                data = self.cache.read_verified(self.source, entry)
                self.cache.demote(self.source, [entry])
                for sample in samples(data, entry.name):
                    buffer.append(sample)
                    if len(buffer) > self.shuffle:
                        yield self._out(self._draw(buffer, rng))
                del data
        finally:
            wait([f for pending in fills.values() for f in pending])
        while buffer:
            yield self._out(self._draw(buffer, rng))

    @staticmethod
    def _draw(buffer: list[dict], rng: random.Random) -> dict:
        i = rng.randrange(len(buffer))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        return buffer.pop()

    def _out(self, sample: dict) -> Any:
        return self.decode(sample) if self.decode is not None else sample

    def __repr__(self) -> str:
        return (f"<ShardDataset {len(self.shards)} shards, {self.shards.total_bytes / 1e6:,.1f} MB from "
                f"{self.source!r} via {self.cache.root}, rank {self.rank}/{self.world_size}, epoch {self.epoch}>")
