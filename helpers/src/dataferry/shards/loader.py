"""A DataLoader over a :class:`~dataferry.shards.ShardDataset` that can say where it is and start there again.

Colab runtimes disconnect. Save :meth:`ShardLoader.state_dict` with each checkpoint; after a restart,
:meth:`ShardLoader.load_state_dict` continues that epoch in the same order, with nothing given twice or
skipped. It works because the DataLoader takes batches from its workers in turn, and each worker's
stream is a pure function of the plan and the index: the batch count says how far each worker got.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from dataferry.shards.dataset import ShardDataset

__all__ = ["ShardLoader"]

_MUST_MATCH = ("seed", "rank", "world_size", "num_workers", "batch_size", "drop_last", "shards")


class ShardLoader(DataLoader):
    """``DataLoader(dataset, batch_size, num_workers=..., ...)`` that counts the batches it gave this epoch.

        loader = ShardLoader(ds, batch_size=64, num_workers=2)
        loader.load_state_dict(checkpoint["data"])          # after a restart; skip on a fresh start
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)                           # keeps a loaded position for its own epoch
            for batch in loader:
                ...
                checkpoint = {"model": ..., "data": loader.state_dict()}
    """

    dataset: ShardDataset

    def __init__(self, dataset: ShardDataset, batch_size: int | None = 1, **kwargs: Any) -> None:
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers keep an old copy of the dataset (its epoch and position): "
                             "leave it off with ShardLoader")
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.batches = 0
        self._start = self._start_of_iteration = 0  # batches given before this iteration (a loaded position)

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next; a position loaded for this same epoch is kept."""
        if epoch != self.dataset.epoch:
            self.dataset._resume, self._start = None, 0
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.batches, self._start_of_iteration, self._start = self._start, self._start, 0
        for batch in super().__iter__():
            self.batches += 1
            yield batch
        self.dataset._resume, self._start_of_iteration = None, 0  # the epoch is whole

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: its epoch, the samples each worker stream gave so far, and whose turn is next."""
        ds = self.dataset
        workers, next_worker = self._position(self.batches)
        return {"epoch": ds.epoch, "batches": self.batches, "workers": workers, "next": next_worker,
                "seed": ds.seed, "rank": ds.rank, "world_size": ds.world_size, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "shards": len(ds.shards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`): the next iteration gives the rest of its epoch."""
        mine = self.state_dict()
        wrong = [f"{k} {state.get(k)!r} (now {mine[k]!r})" for k in _MUST_MATCH if state.get(k) != mine[k]]
        if wrong:
            raise ValueError("this loader state was saved under other settings: " + ", ".join(wrong)
                             + "; resume with the same ones")
        self.dataset.resume_at(state["epoch"], state["workers"], state["next"])
        self._start = state["batches"]

    def _position(self, batches: int) -> tuple[list[int], int]:
        """(samples each worker stream gave, the stream whose turn is next) after ``batches`` this epoch. The
        DataLoader takes one batch from each worker in turn, passing over those that have run out."""
        size = self.batch_size or 1
        if self.num_workers == 0:
            return [batches * size], 0
        ds, workers = self.dataset, self.num_workers
        at = ds.resumed()
        base, role = (at["workers"], at["next"]) if at else ([0] * workers, 0)
        totals = [ds.samples_of(w, workers) for w in range(workers)]
        per = [t // size if self.drop_last else math.ceil(t / size) for t in totals]
        left = [n - math.ceil(b / size) for n, b in zip(per, base)]
        taken = list(base)
        batches -= self._start_of_iteration
        while batches > 0 and any(n > 0 for n in left):
            if left[role] > 0:
                left[role] -= 1
                taken[role] = min(taken[role] + size, totals[role])
                batches -= 1
            role = (role + 1) % workers
        return taken, role

    def __repr__(self) -> str:
        return f"<ShardLoader epoch {self.epoch}, {self.batches} batches given, over {self.dataset!r}>"
