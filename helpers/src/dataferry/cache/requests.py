"""What the index writer is asked to do: one frozen dataclass per request, and the rows they carry.

The writer (:class:`dataferry.cache.index.IndexWriter`) applies them in batches, one transaction each. A
request someone waits for (:class:`Reserve`, :class:`Forget`, :class:`Flush`) is queued with a future that
gets its answer; the others are fire-and-forget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

from dataferry.cache.store import Row

__all__ = ["Reserve", "Forget", "Ready", "Placed", "Touch", "Flush", "Stop", "Many", "Request", "Queued",
           "Answer"]


@dataclass(frozen=True)
class Reserve:
    """Room for a fill (or more room for a lease): its row, in state 'filling'. Answered None when reserved,
    else a :class:`~dataferry.cache.budget.Refusal`."""

    row: Row


@dataclass(frozen=True)
class Forget:
    """A failed fill's reservation (or a lease given back): its row goes. A full disk fails it; it is tried
    again with a later batch."""

    key: str
    pid: int


@dataclass(frozen=True)
class Ready:
    """A fill with its own reservation is durable in place: its row is marked ready."""

    crc32c: str
    when: float
    key: str


@dataclass(frozen=True)
class Placed:
    """A fill on ``lease``'s room, renamed into place at ``path`` but not yet durable: after one ``syncfs`` for
    its batch, ``row`` is written ready and its size taken off the lease in one transaction, then ``release``
    lets go of its fill lock."""

    row: Row
    lease: str
    path: str
    release: Callable[[], None]


@dataclass(frozen=True)
class Touch:
    """Recent uses: key -> when, for the LRU order."""

    touched: dict[str, float]


@dataclass(frozen=True)
class Flush:
    """Answered once everything queued before it is written."""


@dataclass(frozen=True)
class Stop:
    """The writer's thread ends after this batch."""


@dataclass(frozen=True)
class Many:
    """The writes of one turn of the download loop, queued as one item (one wake-up of the writer)."""

    items: list[Queued]


Request = Union[Reserve, Forget, Ready, Placed, Touch, Flush, Stop, Many]
Answer = Union[Future, "asyncio.Future[Any]", None]


class Queued(NamedTuple):
    """A request as the writer holds it: with the future waiting for its answer (None: no one waits) and the
    index it writes to (a strong reference: the cache lives until it is applied)."""

    request: Request
    answer: Answer
    owner: Any
