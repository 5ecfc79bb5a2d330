"""Several ways of doing one thing, timed side by side: each repetition runs every way once, in a fresh
shuffled order, so a machine or network that drifts during the run slows every way alike rather than
whichever ran last (MEASUREMENT.md: compare in one run, as ratios, at least five repetitions).

:func:`interleave` runs and times the ways and returns one row per call; :func:`medians` is the table a
lesson prints from those rows (median with its bootstrap interval, and the range).
"""

from __future__ import annotations

import operator
import random
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dataferry.errors import BadArgument

__all__ = ["Turn", "interleave", "medians"]


@dataclass(frozen=True)
class Turn:
    """One call of one way: its name, its repetition (0 for the warm-up round, whose rows are dropped) and
    a fresh empty folder of its own when :func:`interleave` was given ``work_dir`` (else None)."""

    way: str
    repeat: int
    folder: Path | None


Way = Callable[[Turn], Any]


def interleave(ways: Mapping[str, Way], repeats: int, seed: int = 0, *, warm_up: bool = False,
               work_dir: str | Path | None = None, say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Call every way once per repetition, in an order shuffled anew each repetition, and time each call.

    A way is called with its :class:`Turn` and returns None (the row is its wall time), a mapping (added
    to the row; a ``seconds`` of its own replaces the wall time, for a way that times only part of its
    work; ``way``, ``repeat`` and ``order`` are refused), or a list of mappings (one row each, as a training run's epochs). ``warm_up`` runs one more
    round first and drops it (imports, clients, a CLI's first start). With ``work_dir``, each call gets a
    fresh folder under it, deleted after the call and outside its clock (``work_dir`` itself stays). ``say``
    gets a line per call. A way that raises stops the run: the exception propagates, and no rows are returned.

    Columns: ``way``, ``repeat``, ``order`` (the call's place in its round, from 1), ``seconds``, then
    what the ways returned. Rows are sorted by repetition and then in the order ``ways`` lists them, so a
    table grouped with ``sort=False`` lists the ways as given; ``order`` says when each one ran.
    """
    names = list(ways)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise BadArgument(f"ways must map one or more names to callables, not {names!r}")
    if not all(callable(ways[n]) for n in names):
        raise BadArgument("every way must be a callable that takes a Turn")
    try:
        rounds = operator.index(repeats)
    except TypeError:
        rounds = 0
    if isinstance(repeats, bool) or rounds < 1:
        raise BadArgument(f"repeats must be a whole number of at least 1, not {repeats!r}")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for repeat in range(0 if warm_up else 1, rounds + 1):
        for position, name in enumerate(rng.sample(names, len(names)), start=1):
            folder = _fresh(work_dir, name, repeat)
            try:
                t0 = time.perf_counter()
                out = ways[name](Turn(name, repeat, folder))
                seconds = time.perf_counter() - t0
            finally:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
            made = [{"way": name, "repeat": repeat, "order": position, "seconds": seconds, **extra}
                    for extra in _extras(name, out)]
            if say:
                say(f"{'warm-up' if repeat == 0 else f'repeat {repeat}/{rounds}'}: {name} "
                    + ", ".join(f"{r['seconds']:.3g} s" if isinstance(r["seconds"], (int, float)) else
                                f"{r['seconds']}" for r in made))
            if repeat:
                rows += made
    rows.sort(key=lambda r: (r["repeat"], names.index(r["way"])))  # stable: a way's several rows keep their order
    return pd.DataFrame(rows)


def _fresh(work_dir: str | Path | None, name: str, repeat: int) -> Path | None:
    if work_dir is None:
        return None
    safe = "".join(c if c.isalnum() else "-" for c in name).strip("-") or "way"
    folder = Path(work_dir) / f"{repeat}-{safe}"
    if folder.exists():
        shutil.rmtree(folder)  # an earlier run's: a folder that cannot go says why here, not at mkdir
    folder.mkdir(parents=True)
    return folder


def _extras(name: str, out: Any) -> list[Mapping[str, Any]]:
    if out is None:
        return [{}]
    made = [out] if isinstance(out, Mapping) else out if isinstance(out, list) else None
    if made and all(isinstance(r, Mapping) for r in made):
        taken = sorted({k for r in made for k in r} & {"way", "repeat", "order"})
        if taken:
            raise BadArgument(f"the way {name!r} returned {taken[0]!r}, a column interleave fills itself")
        return made
    raise BadArgument(f"the way {name!r} returned {type(out).__name__}: a way returns None, a mapping of "
                      "values for its row, or a non-empty list of such mappings (one row each)")


def medians(rows: pd.DataFrame, value: str = "seconds", by: str | list[str] = "way") -> pd.DataFrame:
    """Per group of ``by``, in the order the groups first appear: how many values (``n``), their median with
    a 95% bootstrap interval, and the smallest and largest, each column named for ``value`` (``median_MBps``).
    Rows with an ``error`` are left out and counted apart (``errors``)."""
    from dataferry.harness.stats import summarize_frame

    keys = [by] if isinstance(by, str) else list(by)
    missing = [c for c in (*keys, value) if c not in rows.columns]
    if missing:
        raise BadArgument(f"the rows have no column {missing[0]!r}; they have {list(rows.columns)}")
    table = summarize_frame(rows, keys, value=value)
    first = {k: i for i, k in enumerate(dict.fromkeys(rows[keys].itertuples(index=False, name=None)))}
    table = table.iloc[sorted(range(len(table)), key=lambda i: first[tuple(table.loc[i, keys])])]
    stats = ["median", "ci_low", "ci_high", "min", "max"]
    columns = [*keys, "n", *stats] + (["errors"] if table["errors"].any() else [])
    return table[columns].rename(columns={s: f"{s}_{value}" for s in stats}).reset_index(drop=True)
