"""A figure for a handful of repetitions: each one a dot, the median a short line, the count above.

With five to ten values per way, a box or a bar hides how few they are; a log axis has no zero for a
bar to start from either. The lessons draw their side-by-side comparisons this way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dataferry.errors import BadArgument
from dataferry.harness.plots.figures import _finish, log_axis
from dataferry.harness.plots.settings import LAB_NOTE
from dataferry.harness.stats import error_mask

__all__ = ["medians_and_dots", "finish"]


def medians_and_dots(ax: Axes, rows: pd.DataFrame, value: str, by: str = "way", order: Sequence[Any] | None = None,
                     colours: Mapping[Any, Any] | None = None, log: bool = True, offset: float = 0.0,
                     width: float = 0.6, label: str | None = None, counts: bool = True) -> list[Any]:
    """Draw ``rows[value]`` per group of ``by`` at x = 0, 1, ...: every row a dot, the median a line.

    ``order`` picks and orders the groups (default: as they first appear); ``colours`` maps a group to
    its colour (default: the C0, C1, ... cycle). ``offset`` and ``width`` place the line and dots around
    each x, so two calls can draw two values per group side by side; ``label`` names the median lines in
    a legend. ``log`` gives a log y axis labelled in plain numbers, with room for the ``n=`` labels, and
    leaves out values of 0 or less (a log axis has no place for them); else the axis starts at 0. Rows with
    an ``error`` are left out, as every figure leaves them out. Returns the groups in the order drawn."""
    for column in (by, value):
        if column not in rows.columns:
            raise BadArgument(f"the rows have no column {column!r}; they have {list(rows.columns)}")
    groups = list(dict.fromkeys(rows[by])) if order is None else list(order)
    values = pd.to_numeric(rows[value], errors="coerce").where(~error_mask(rows))
    if log:
        values = values.where(values > 0)  # a log axis has no place for 0 or less
    drawn = values[rows[by].isin(groups)].dropna()
    if drawn.empty:
        raise BadArgument(f"no {'positive ' if log else ''}values of {value!r} to draw for {groups!r}")
    labelled = False
    for i, group in enumerate(groups):
        g = values[rows[by] == group].dropna().to_numpy()
        if not g.size:
            continue
        colour = (colours or {}).get(group, f"C{i % 10}")
        x = i + offset
        ax.hlines(float(np.median(g)), x - width / 2, x + width / 2, color=colour, linewidth=3,
                  label=label if label and not labelled else "_nolegend_")
        labelled = True
        ax.scatter(np.full(g.size, x), g, color=colour, edgecolors="black", s=18, zorder=3)
        if counts:
            ax.annotate(f"n={g.size}", (x, float(g.max())), xytext=(0, 4), textcoords="offset points",
                        ha="center", fontsize=8)
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])
    if log:
        lo, hi = ax.get_ylim() if ax.get_yscale() == "log" else (np.inf, 0.0)  # a second call widens the first's
        ax.set_yscale("log")
        ax.set_ylim(min(lo, float(drawn.min()) / 1.5), max(hi, float(drawn.max()) * 2))
        log_axis(ax)
    else:
        ax.set_ylim(0, max(ax.get_ylim()[1], float(drawn.max()) * 1.25))
    return groups


def finish(fig: Figure, lab: bool = False) -> Figure:
    """A tight layout; for the offline lab's figures, the footnote that they are not cloud measurements
    (the standard figures' own footnote, laid out as they lay it out)."""
    _finish(fig, [LAB_NOTE] if lab else [], fig.axes, own=True)
    return fig
