"""The standard figures: first read vs repeat, by region, by runtime, per epoch, and accelerator
utilisation, each a grid of panels that never pools two regions or two file sizes."""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import cast
from pathlib import Path

import matplotlib
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from dataferry.harness.results import recorded_cache_states
from dataferry.harness.plots.palette import RGB, darker, lighter, method_palette, ordered_methods, patch
from dataferry.harness.plots.settings import (LAB_NOTE, PASS_KINDS, epochs_of, listing, png_metadata, record_box,
                                      region_order, scope, settings_of, sizes_of)

Y_LABEL = "MB/s (10^6 B/s) per epoch, log scale"
NO_DATA = "no data"
_STYLE = "whitegrid"
_WRAP = 3  # panels per row of a grid
_KIND_TITLES = {PASS_KINDS[0]: "first read (pass 1)", PASS_KINDS[1]: "repeat (pass >= 2)"}


def first_vs_repeat(rows: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Box plots of epoch MB/s per method, first read next to repeat, one panel per region and file size.

    Shows whether a method's speed comes from caching (repeat far above first read) or from the
    transfer itself. First reads are solid boxes, repeats hatched, both in the method's colour. On a
    caller's ``ax`` the rows must hold one region and one file size (a box never pools two).
    """
    epochs, notes = epochs_of(rows)
    settings = settings_of(epochs)
    methods = ordered_methods(epochs["method"])
    palette = method_palette(methods)
    title = "Epoch throughput: first read vs repeat"
    own = ax is None
    if ax is not None:
        if len(settings) > 1:
            raise ValueError(f"rows hold {len(settings)} region and file-size settings "
                             f"({'; '.join(', '.join(s) for s in settings[:4])}); a box never pools them: pass the "
                             "rows of one setting, or no ax for a panel per setting")
        fig, axes = cast(Figure, ax.figure), [ax]
    else:
        fig, axes = _grid(max(1, len(settings)), (max(4.5, 1.1 * max(1, len(methods)) + 1.5), 4.6))
    for panel, (region, size) in zip(axes, settings):
        sub = epochs[(epochs["region"] == region) & (epochs["size"] == size)]
        name = f"{region}, {size}"
        panel.set_title(name if len(settings) > 1 else f"{title}\n{name}; runtimes: {listing(sub['runtime'])}", fontsize=10)
        panel.set_xlabel("method")
        present = [m for m in methods if m in set(sub["method"])]
        _boxes(panel, sub, name, "method", present, "pass_kind", list(PASS_KINDS),
               lambda method, kind: palette[method], lambda method, kind: kind == PASS_KINDS[1])
    if not settings:
        axes[0].set_title(title, fontsize=10)
        _no_data(axes[0])
    else:
        _log_limits(axes, epochs["MBps"])
        handles = [patch((0.55, 0.55, 0.55), False, "first read (pass 1)"),
                   patch((0.55, 0.55, 0.55), True, "repeat (pass >= 2)")]
        axes[min(len(axes), _WRAP) - 1].legend(handles=handles, title="pass", loc="upper left",
                                               bbox_to_anchor=(1.01, 1.0), frameon=False)
    _y_labels(axes)
    if own and len(settings) > 1:
        fig.suptitle(f"{title}: a panel per region (nearest first) and file size\n"
                     f"runtimes: {listing(epochs['runtime'])}", fontsize=11)
    _finish(fig, notes, axes, own)
    return fig


def by_region(rows: pd.DataFrame) -> Figure:
    """Box plots of epoch MB/s per region (nearest first) and method: a row of panels per file size,
    first reads on the left, repeats on the right.

    Shows how far the data is from the machine matters, and for which methods.
    """
    epochs, notes = epochs_of(rows)
    sizes: list[str | None] = [*sizes_of(epochs)] or [None]
    regions = region_order(epochs)
    methods = ordered_methods(epochs["method"])
    palette = method_palette(methods)
    panel_width = max(4.5, 0.8 + max(1, len(regions)) * max(1.2, 0.3 * len(methods)))
    fig, grid = _rows_of_panels(len(sizes), 2, (panel_width, 4.6))
    for row, size in zip(grid, sizes):
        of_size = epochs[epochs["size"] == size]
        x_levels = [r for r in regions if r in set(of_size["region"])]
        for ax, kind in zip(row, PASS_KINDS):
            name = _KIND_TITLES[kind] + (f", {size}" if size else "")
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("region (nearest first)")
            subset = of_size[of_size["pass_kind"] == kind]
            if subset.empty:
                _no_data(ax, clear_y=epochs.empty)
            else:
                _boxes(ax, subset, name, "region", x_levels, "method", methods,
                       lambda region, method: palette[method], lambda region, method: False)
    return _faceted_finish(fig, grid, epochs, notes, methods, palette, "Epoch throughput by region")


def by_runtime(rows: pd.DataFrame) -> Figure:
    """Box plots of epoch MB/s per runtime and method, for each region and file size measured on more
    than one runtime kind: a row of panels per such setting, first reads left, repeats right.

    Shows whether a method's speed depends on the machine it runs on (CPU, GPU, Colab, local). A
    setting measured on one runtime kind says nothing about runtimes, so it is left out; with none
    left, the figure says so.
    """
    epochs, notes = epochs_of(rows)
    settings = [s for s in settings_of(epochs)
                if epochs[(epochs["region"] == s[0]) & (epochs["size"] == s[1])]["runtime"].nunique() >= 2]
    methods = ordered_methods(epochs["method"])
    palette = method_palette(methods)
    runtimes = sorted(set(epochs["runtime"]))
    panel_width = max(4.5, 0.8 + max(1, len(runtimes)) * max(1.2, 0.3 * len(methods)))
    fig, grid = _rows_of_panels(max(1, len(settings)), 2, (panel_width, 4.6))
    for row, (region, size) in zip(grid, settings):
        setting = epochs[(epochs["region"] == region) & (epochs["size"] == size)]
        x_levels = sorted(set(setting["runtime"]))
        for ax, kind in zip(row, PASS_KINDS):
            name = f"{_KIND_TITLES[kind]}, {region}, {size}"
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("runtime")
            subset = setting[setting["pass_kind"] == kind]
            if subset.empty:
                _no_data(ax, clear_y=False)
            else:
                _boxes(ax, subset, name, "runtime", x_levels, "method", methods,
                       lambda runtime, method: palette[method], lambda runtime, method: False)
    if not settings:
        for ax in grid[0]:
            _no_data(ax, text="no region and file size\nwas measured on two runtime kinds" if len(epochs) else NO_DATA)
    return _faceted_finish(fig, grid, epochs, notes, methods, palette, "Epoch throughput by runtime",
                           drawn=bool(settings))


def per_epoch(rows: pd.DataFrame) -> Figure:
    """Median epoch MB/s against pass number per method, with interquartile-range bars, a panel per
    region and file size.

    Shows how fast each method warms up: a cache should jump after pass 1 and then stay flat.
    """
    epochs, notes = epochs_of(rows)
    settings = settings_of(epochs)
    methods = ordered_methods(epochs["method"])
    palette = method_palette(methods)
    fig, axes = _grid(max(1, len(settings)), (6.0, 4.6))
    for ax, (region, size) in zip(axes, settings):
        sub = epochs[(epochs["region"] == region) & (epochs["size"] == size)]
        name = f"{region}, {size}"
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("pass (1 = first read)")
        present = [m for m in methods if m in set(sub["method"])]
        step = min(0.08, 0.6 / len(present))
        for j, method in enumerate(present):
            of_method = sub[sub["method"] == method]
            stats = (of_method.groupby("pass")["MBps"]
                     .agg(median="median", q1=lambda s: s.quantile(0.25), q3=lambda s: s.quantile(0.75), n="size"))
            for p in stats.index:
                record_box(fig, name, str(p), method, of_method[of_method["pass"] == p])
            x = stats.index.to_numpy(dtype=float) + (j - (len(present) - 1) / 2) * step
            med = stats["median"].to_numpy()
            yerr = np.vstack([med - stats["q1"].to_numpy(), stats["q3"].to_numpy() - med])
            n_lo, n_hi = int(stats["n"].min()), int(stats["n"].max())
            n_text = f"n={n_lo}" if n_lo == n_hi else f"n={n_lo}-{n_hi}"
            ax.errorbar(x, med, yerr=yerr, color=palette[method], marker="o", markersize=5, capsize=3, linewidth=1.5,
                        label=f"{method} ({n_text} per pass)")
        passes = sorted(sub["pass"].unique())
        ax.set_xticks(passes, [str(p) for p in passes])
        ax.legend(title="method", loc="best", fontsize=7, title_fontsize=8, frameon=False)
    if settings:
        _log_limits(axes, epochs["MBps"])
    else:
        _no_data(axes[0])
    for ax in axes[::_WRAP]:
        ax.set_ylabel("median " + Y_LABEL + "\nbars: interquartile range")
    fig.suptitle("Median epoch throughput per pass, a panel per region and file size\n" + scope(epochs), fontsize=11)
    _finish(fig, notes, axes, True)
    return fig


def au_by_method(rows: pd.DataFrame, methods: Sequence[str] | None = None, target: float = 0.9) -> Figure:
    """Accelerator utilisation of each method, epoch 1 (hatched) and later epochs (solid), from ``train``
    rows: a panel per region (columns) and compute profile (rows), a bar at the median, a dot per run,
    and a line at ``target`` (MLPerf Storage's 90% pass)."""
    import matplotlib.pyplot as plt

    ok = rows[(rows["phase"] == "train") & (rows["error"] == "") & (rows["pass"] >= 1)]
    regions, computes = sorted(ok["region"].unique()) or [""], sorted(ok["compute_profile"].unique()) or [""]
    methods = [m for m in (methods or ordered_methods(ok["method"].unique())) if m in set(ok["method"])]
    palette = method_palette(methods)
    with sns.axes_style(_STYLE):
        fig, axes = plt.subplots(len(computes), len(regions), figsize=(4.2 * len(regions) + 1.5, 3.4 * len(computes)),
                                 sharey=True, squeeze=False)
    plt.close(fig)
    width = 0.38
    for i, compute in enumerate(computes):
        for j, region in enumerate(regions):
            ax, cell = axes[i][j], ok[(ok["compute_profile"] == compute) & (ok["region"] == region)]
            ax.set_ylim(0, 105)
            if cell.empty:  # the y axis is shared: no log scale, no cleared ticks (_no_data's), only the words
                ax.set_xticks([])
                ax.text(0.5, 0.5, NO_DATA, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="0.4")
                continue
            for k, method in enumerate(methods):
                for later, offset in ((False, -width / 2), (True, width / 2)):
                    g = cell[(cell["method"] == method) & ((cell["pass"] > 1) == later)]["au"] * 100
                    if g.empty:
                        continue
                    c = palette[method]
                    ax.bar(k + offset, g.median(), width * 0.9, color=c if later else lighter(c), edgecolor=darker(c),
                           hatch=None if later else "///")
                    ax.scatter([k + offset] * len(g), g, color="black", s=8, zorder=3)
            ax.axhline(target * 100, color="tab:red", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
            ax.set_ylim(0, 105)
            ax.set_title(f"{compute}\n{region}", fontsize=9)
            if j == 0:
                ax.set_ylabel("accelerator utilisation, %")
    later_epochs = _later_epochs(ok)
    handles = [patch((0.5, 0.5, 0.5), True, "epoch 1"), patch((0.5, 0.5, 0.5), False, later_epochs),
               Line2D([], [], color="tab:red", linestyle="--", label=f"{target:.0%} (MLPerf Storage pass)")]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False, fontsize=8)
    notes = [f"bars: median of runs; dots: each run; {scope(ok)}" if len(ok) else NO_DATA]
    if any(str(r).startswith("lab:") for r in ok["region"]):
        notes.append(LAB_NOTE)
    fig.suptitle(f"Will the accelerator starve? Utilisation by method, epoch 1 and {later_epochs}", fontsize=10)
    fig.text(0.01, -0.02, "; ".join(notes), fontsize=8, style="italic", color="0.25")
    states = textwrap.fill(_cache_states(ok, methods, later_epochs), width=int(fig.get_figwidth() * 20))
    fig.text(0.01, -0.04, states, fontsize=8, style="italic", color="0.25", va="top")
    fig.tight_layout()
    return fig


def _later_epochs(rows: pd.DataFrame) -> str:
    """What the later epochs of ``rows`` are: ``epoch 2``, ``epochs 2-4``."""
    passes = sorted(int(p) for p in rows["pass"].unique() if p > 1)
    if not passes:
        return "later epochs"
    return f"epoch {passes[0]}" if len(passes) == 1 else f"epochs {passes[0]}-{passes[-1]}"


def _cache_states(rows: pd.DataFrame, methods: Sequence[str], later: str) -> str:
    """The cache state each method's epochs started in, epoch 1 and then the later ones, grouped by state."""
    recorded = recorded_cache_states(rows)
    if recorded is None:
        return "cache states: not recorded"
    rows = rows.assign(cache_state=recorded)
    parts = []
    for name, group in (("epoch 1", rows[rows["pass"] == 1]), (later, rows[rows["pass"] > 1])):
        by_state: dict[str, list[str]] = {}
        for method in methods:
            for state in sorted(group.loc[group["method"] == method, "cache_state"].fillna("not recorded").unique()):
                by_state.setdefault(state, []).append(method)
        if by_state:
            parts.append(f"{name} " + ", ".join(f"{state} ({', '.join(ms)})" for state, ms in sorted(by_state.items())))
    return "cache states: " + "; ".join(parts)


def save(fig: Figure, path_without_suffix: str | Path) -> list[Path]:
    """Write ``<path>.svg`` (text kept as text, so it is searchable) and ``<path>.png`` (150 dpi).

    The PNG carries what each box pooled (see :func:`dataferry.harness.plots.box_provenance`). Creates the
    parent folders; returns ``[svg_path, png_path]``.
    """
    base = Path(path_without_suffix)
    base.parent.mkdir(parents=True, exist_ok=True)
    svg = base.with_name(base.name + ".svg")
    png = base.with_name(base.name + ".png")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dataferry"}):
        fig.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None})
    fig.savefig(png, format="png", dpi=150, bbox_inches="tight", metadata=png_metadata(fig))
    return [svg, png]


def standard_figures(rows: pd.DataFrame, out_dir: str | Path, prefix: str = "") -> dict[str, list[Path]]:
    """Draw and save the four standard figures into ``out_dir`` as ``<prefix><name>.svg/.png``.

    Returns ``{name: [svg, png]}`` for first_vs_repeat, by_region, by_runtime and per_epoch. A
    figure without data is still saved, saying "no data", so a missing figure never goes unnoticed.
    """
    drawers: dict[str, Callable[[pd.DataFrame], Figure]] = {
        "first_vs_repeat": first_vs_repeat,
        "by_region": by_region,
        "by_runtime": by_runtime,
        "per_epoch": per_epoch,
    }
    out = Path(out_dir)
    written: dict[str, list[Path]] = {}
    for name, draw in drawers.items():
        fig = draw(rows)
        try:
            written[name] = save(fig, out / f"{prefix}{name}")
        finally:
            _close(fig)
    return written


# -- helpers -------------------------------------------------------------------------------------


def _grid(n: int, panel: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    """``n`` panels sharing a y axis, at most ``_WRAP`` to a row; unused cells are removed."""
    cols = min(_WRAP, n)
    fig, grid = _rows_of_panels(math.ceil(n / cols), cols, panel)
    axes = [ax for row in grid for ax in row]
    for extra in axes[n:]:
        fig.delaxes(extra)
    return fig, axes[:n]


def _rows_of_panels(nrows: int, ncols: int, panel: tuple[float, float]) -> tuple[Figure, list[list[Axes]]]:
    import matplotlib.pyplot as plt

    with sns.axes_style(_STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(panel[0] * ncols + 2.2, panel[1] * nrows + 0.9),
                                 sharey=True, squeeze=False)
    plt.close(fig)  # detached: no second display in Jupyter, no figure kept alive by pyplot
    return fig, [list(row) for row in axes]


def _faceted_finish(fig: Figure, grid: list[list[Axes]], epochs: pd.DataFrame, notes: list[str], methods: list[str],
                    palette: dict[str, RGB], title: str, drawn: bool = True) -> Figure:
    axes = [ax for row in grid for ax in row]
    if drawn and not epochs.empty:
        _log_limits(axes, epochs["MBps"])
        handles = [Line2D([], [], color=palette[m], marker="s", markersize=9, linestyle="", label=m) for m in methods]
        grid[0][-1].legend(handles=handles, title="method", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for row in grid:
        row[0].set_ylabel(Y_LABEL)
    fig.suptitle(f"{title}\n{scope(epochs)}", fontsize=11)
    _finish(fig, notes, axes, True)
    return fig


def _y_labels(axes: Sequence[Axes]) -> None:
    for ax in axes[::_WRAP]:
        ax.set_ylabel(Y_LABEL)


def _close(fig: Figure) -> None:
    """Let pyplot forget the figure; its memory goes with the last reference. (``fig.clear()`` on
    shared log axes warns "non-positive ylim" in matplotlib 3.10, Colab's version.)"""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


def _no_data(ax: Axes, clear_y: bool = True, text: str = NO_DATA) -> None:
    """Write ``text`` across the axes; ``clear_y=False`` keeps y ticks a sharing panel still uses."""
    ax.set_yscale("log")
    ax.set_ylim(1, 1000)
    ax.set_xticks([])
    if clear_y:
        ax.set_yticks([])
        ax.set_yticks([], minor=True)
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
            fontsize=16 if text == NO_DATA else 10, color="0.4")


def _boxes(ax: Axes, data: pd.DataFrame, panel: str, x_col: str, x_levels: list[str], hue_col: str,
           hue_levels: list[str], colour: Callable[[str, str], RGB], hatched: Callable[[str, str], bool]) -> None:
    """Dodged box plots, one per (x, hue) group that has data, each with ``n=`` written above it.

    A small group (five values or fewer) or one whose box collapses to a line also shows its
    values as dots in the method's colour, so a box of equal values keeps its colour.
    """
    width = 0.8 / len(hue_levels)
    crowded = len(hue_levels) > 3
    for i, x_value in enumerate(x_levels):
        for j, hue_value in enumerate(hue_levels):
            group = data[(data[x_col] == x_value) & (data[hue_col] == hue_value)]
            values = group["MBps"].to_numpy()
            if values.size == 0:
                continue
            record_box(cast(Figure, ax.figure), panel, x_value, hue_value, group)
            pos = i - 0.4 + width * (j + 0.5)
            face = colour(x_value, hue_value)
            hatch = hatched(x_value, hue_value)
            edge = darker(face)
            parts = ax.boxplot(
                [values], positions=[pos], widths=width * 0.85, patch_artist=True, manage_ticks=False,
                boxprops={"facecolor": lighter(face) if hatch else face, "edgecolor": edge, "linewidth": 1.0},
                medianprops={"color": "black", "linewidth": 1.5},
                whiskerprops={"color": edge}, capprops={"color": edge},
                flierprops={"marker": "o", "markersize": 3, "markerfacecolor": face, "markeredgecolor": edge},
            )
            if hatch:
                parts["boxes"][0].set_hatch("///")
            q1, q3 = np.percentile(values, [25, 75])
            if values.size <= 5 or q3 <= q1 * 1.001:
                ax.scatter(np.full(values.size, pos), values, s=16, color=face, edgecolors=edge, linewidths=0.8,
                           zorder=4, gid="values")
            ax.annotate(f"n={values.size}", xy=(pos, float(values.max())), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=90 if crowded else 0, gid="n-label")
    ax.set_xticks(range(len(x_levels)))
    rotate = len(x_levels) > 4 or max((len(x) for x in x_levels), default=0) > 14
    ax.set_xticklabels(x_levels, rotation=25 if rotate else 0, ha="right" if rotate else "center")
    ax.set_xlim(-0.5, len(x_levels) - 0.5)


def log_axis(ax: Axes) -> None:
    """A log y axis labelled in plain numbers (``20``, not ``2 x 10^1``): every decade, and the 2s and
    5s between them when the axis spans less than two decades (every whole step within one). Call after the
    limits are set."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    plain = mticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    if np.log10(hi / lo) < 2:  # within a decade or so, every whole step (3, 4, 5 ...) so values can be read off
        ax.yaxis.set_minor_locator(mticker.LogLocator(subs=(2.0, 5.0) if np.log10(hi / lo) >= 1 else
                                                      tuple(float(k) for k in range(2, 10))))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(mticker.NullFormatter())


def _log_limits(axes: Sequence[Axes], values: pd.Series) -> None:
    """Log y axis over the data with headroom above for the n labels; plain-number tick labels."""
    lo, hi = np.log10(float(values.min())), np.log10(float(values.max()))
    span = max(hi - lo, 0.5)
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylim(10 ** (lo - 0.08 * span), 10 ** (hi + 0.2 * span))
        log_axis(ax)


def _finish(fig: Figure, notes: list[str], axes: Sequence[Axes], own: bool) -> None:
    """Footnotes (lab data, rows left out) and a tight layout; on a caller's axes, notes join the title."""
    if not own:
        if notes:
            for ax in axes:
                ax.set_title(ax.get_title() + "\n" + "\n".join(notes), fontsize=9)
        return
    bottom = 0.0
    if notes:
        height_pt = fig.get_figheight() * 72
        bottom = (len(notes) * 11 + 8) / height_pt
        fig.text(0.01, 0.01, "\n".join(notes), ha="left", va="bottom", fontsize=8, style="italic", color="0.25")
    fig.tight_layout(rect=(0, bottom, 1, 1))
