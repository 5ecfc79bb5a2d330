"""PyTorch: an IterableDataset of tar shards streamed through the verified cache.

Each epoch is a pure function of (seed, epoch, rank, world size, worker, workers): a seeded shuffle of
the shard order, every shard given to exactly one (rank, worker), and a seeded shuffle buffer that
mixes samples within and across that worker's shards. While a worker reads shard k, its next
``ahead`` shards download in the background; a shard read this epoch is demoted in the cache, so
when the budget needs room it goes first and shards kept from the last epoch stay until read.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from dataferry.cache import Cache, DamagedAtSource
from dataferry.shards.make import INDEX, read_index
from dataferry.shards.tar import ShardFormatError, samples
from dataferry.sources import Entry, EntryTable, NotFoundAtSource, Source

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
            raise NotFoundAtSource(f"no .tar shards in {getattr(source, 'uri', source)}: check the path, or make "
                                   "them with `dataferry shards make`")
        listed, self.counts = _from_index(source, listed, every=shards is None)
        self.shards = EntryTable(listed)
        self._biggest = max(e.size for e in listed)
        self.epoch = 0
        self._resume: dict | None = None

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
        role, skip = self._role(worker, workers)
        ahead = self._ahead_within_budget(workers)
        yield from (self._out(s) for s in _WorkerEpoch(self, self.plan(role, workers), role, skip, ahead))

    def _ahead_within_budget(self, workers: int) -> int:
        """Shards each worker fills ahead: :attr:`ahead`, fewer when the budget cannot hold every worker's
        shard being read and its fills ahead (a fill evicted before its read would be downloaded twice)."""
        if self.cache.max_bytes is None:
            return self.ahead
        per_worker = self.cache.max_bytes // (workers * max(self._biggest, 1))
        return max(0, min(self.ahead, per_worker - 1))

    def _role(self, worker: int, workers: int) -> tuple[int, int]:
        """Which worker's stream this DataLoader worker gives, and how many of its samples were given before a
        restart (see :meth:`resume_at`)."""
        at = self.resumed()
        if at is None:
            return worker, 0
        if len(at["workers"]) != workers:
            raise ValueError(f"this state was saved for {len(at['workers'])} worker stream(s), this DataLoader has "
                             f"{workers}: resume with the num_workers it was saved with")
        role = (worker + at["next"]) % workers
        return role, at["workers"][role]

    def resumed(self) -> dict | None:
        """The position loaded with :meth:`resume_at`, while it is for the epoch about to be read."""
        at = self._resume
        return at if at is not None and at["epoch"] == self.epoch else None

    def resume_at(self, epoch: int, samples_per_worker: Sequence[int], next_worker: int = 0) -> None:
        """Continue ``epoch`` past the first ``samples_per_worker[w]`` samples of each worker stream ``w`` (one
        entry with no DataLoader workers), the DataLoader's first worker giving stream ``next_worker``, whose
        turn was next: the same order as without the restart, nothing given twice or skipped.
        :class:`~dataferry.shards.ShardLoader` computes these from the batches it gave."""
        self.epoch = epoch
        self._resume = {"epoch": epoch, "workers": list(samples_per_worker), "next": next_worker}

    def samples_of(self, worker: int = 0, workers: int = 1, epoch: int | None = None) -> int:
        """How many samples ``worker`` gives in ``epoch``, from the index (:class:`ValueError` without one)."""
        return sum(self._count(i) for i in self.plan(worker, workers, epoch))

    def _count(self, i: int) -> int:
        if self.counts is None:
            raise ValueError(f"no {INDEX} beside the shards in {getattr(self.source, 'uri', self.source)}: resuming "
                             "mid-epoch needs the sample count of each shard; make shards with `dataferry shards make`")
        return self.counts[i]

    def _out(self, sample: dict) -> Any:
        return self.decode(sample) if self.decode is not None else sample

    def __repr__(self) -> str:
        return (f"<ShardDataset {len(self.shards)} shards, {self.shards.total_bytes / 1e6:,.1f} MB from "
                f"{self.source!r} via {self.cache.root}, rank {self.rank}/{self.world_size}, epoch {self.epoch}>")


def _from_index(source: Source, listed: list[Entry], every: bool) -> tuple[list[Entry], list[int] | None]:
    """The listed shards with the CRC32C their index recorded when they were made (so a shard changed since fails
    its check when filled and when read, whatever the source says of it now), and the samples per shard. With an
    index, each listed shard must be in it in its recorded size, and (``every``: the shards were listed, not
    named) every shard it records must be listed: a shard cut short, replaced, added or deleted since is refused
    here, before a sample is given, rather than read unchecked."""
    index = read_index(source)
    if index is None:
        return listed, None
    known = {s["name"]: s for s in index["shards"]}
    changed = [f"{e.name} is not in it" if e.name not in known else
               f"{e.name} is {e.size} bytes, it recorded {known[e.name]['bytes']}"
               for e in listed if e.name not in known or known[e.name]["bytes"] != e.size]
    if every:
        changed += [f"{name} is gone" for name in sorted(set(known) - {e.name for e in listed})]
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise DamagedAtSource(f"the shards in {getattr(source, 'uri', source)} no longer match their {INDEX}: "
                              f"{'; '.join(changed[:3])}{more}. They changed since they were made; nothing was read: "
                              "remake them with `dataferry shards make`")
    same = [known[e.name] for e in listed]
    checked = [dataclasses.replace(e, crc32c=s["crc32c"]) if s.get("crc32c") else e for e, s in zip(listed, same)]
    return checked, [s["samples"] for s in same]


class _WorkerEpoch:
    """One worker's epoch as a stream of tokens (shard position, sample ordinal) through a seeded shuffle
    buffer, and the samples they stand for. The token stream depends only on the plan, the seed and each
    shard's sample count, so a restart can replay it from the index without reading: shards whose
    samples were all given before the restart are never read again, the others only for what remains."""

    def __init__(self, ds: ShardDataset, plan: list[int], worker: int, skip: int, ahead: int) -> None:
        self.ds, self.skip, self.ahead = ds, skip, ahead
        self.mine = [ds.shards[i] for i in plan]
        self.plan = plan
        self.rng = random.Random(f"{ds.seed}:{ds.epoch}:{ds.rank}:{worker}")
        self.loaded: dict[int, list] = {}  # position -> its samples (None once given)
        self.left: dict[int, int] = {}  # position -> samples not yet given
        self.fills: dict[int, list[Future]] = {}  # position -> its background fill
        self.given = 0

    def __iter__(self) -> Iterator[dict]:
        self.ds.cache.will_read(self.ds.source, self.mine)  # kept from the last epoch: soonest read stays longest
        try:
            for position, i in self._tokens():
                if self.given < self.skip:
                    self._given(position)
                    continue
                if position not in self.loaded:
                    self._load(position)
                sample, self.loaded[position][i] = self.loaded[position][i], None
                self._given(position)
                yield sample
        finally:
            wait([f for pending in self.fills.values() for f in pending])

    def _tokens(self) -> Iterator[tuple[int, int]]:
        buffer: list[tuple[int, int]] = []
        shuffle = self.ds.shuffle
        for position in range(len(self.mine)):
            n = self._open(position)
            self.left[position] = n
            for i in range(n):
                buffer.append((position, i))
                if len(buffer) > shuffle:
                    yield self._draw(buffer)
        while buffer:
            yield self._draw(buffer)

    def _draw(self, buffer: list[tuple[int, int]]) -> tuple[int, int]:
        i = self.rng.randrange(len(buffer))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        return buffer.pop()

    def _open(self, position: int) -> int:
        """The shard's sample count: from the index while replaying what was given before a restart,
        else by reading it now (with the next ``ahead`` shards filling in the background)."""
        if self.given < self.skip and self.ds.counts is not None:
            return self.ds.counts[self.plan[position]]  # read later only if a sample of it is still to come
        for ahead in range(position, min(len(self.mine), position + self.ahead + 1)):
            if ahead not in self.fills:
                self.fills[ahead] = self.ds.cache.fill_later(self.ds.source, [self.mine[ahead]])
        self._load(position)
        return len(self.loaded[position])

    def _load(self, position: int) -> None:
        # Wait for this shard's own fill rather than race it: a fill still queued when the reader had
        # passed would download the shard a second time once evicted.
        wait(self.fills.pop(position, []))
        entry = self.mine[position]
        try:
            data = self.ds.cache.read_verified(self.ds.source, entry)
        except DamagedAtSource as e:  # a disk at fault (DamagedOnDisk) says so itself
            raise DamagedAtSource(f"shard {entry.name} does not match the CRC32C {entry.crc32c} recorded for it "
                                f"(in its {INDEX} when indexed), after {self.ds.cache.max_refetches + 1} downloads: "
                                f"it was damaged or changed at the source since; remake the shards ({e})") from None
        self.ds.cache.demote(self.ds.source, [entry])
        self.loaded[position] = list(samples(data, entry.name))
        if self.ds.counts is not None and len(self.loaded[position]) != self.ds.counts[self.plan[position]]:
            raise ShardFormatError(f"{entry.name} holds {len(self.loaded[position])} samples, its {INDEX} says "
                                   f"{self.ds.counts[self.plan[position]]}: remake the index")

    def _given(self, position: int) -> None:
        self.given += 1
        self.left[position] -= 1
        if not self.left[position]:
            del self.left[position]
            self.loaded.pop(position, None)
