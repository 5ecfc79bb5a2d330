"""Standard figures for benchmark results: throughput per method, first read vs repeat.

Rows are the long-format :class:`pandas.DataFrame` of :data:`dataferry.timing.COLUMNS`. The
figures use only ``phase == "epoch"`` rows whose ``error`` is empty: one epoch row is one whole
pass over the data, so its ``MBps`` is what training sees. Throughput spans orders of magnitude
between methods, so every y axis is logarithmic, and every box is labelled with its sample size so
a box drawn from two points is not mistaken for a solid result.

Each method keeps one colour in every figure (:func:`method_palette`), so figures can be compared
side by side. Figures from the offline lab (regions ``lab:...``) say so in a footnote: they are
not cloud measurements.

Figures are created through pyplot, which picks a backend only if none is configured (Agg on a
machine without a display, the inline backend in Jupyter), and are detached from pyplot at once:
nothing here calls ``matplotlib.use`` or ``plt.show``, a returned figure is shown once when it is
the last expression of a notebook cell, and loops that draw many figures do not keep them alive.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dataferry.timing import COLUMNS

__all__ = [
    "METHOD_ORDER",
    "method_palette",
    "first_vs_repeat",
    "by_region",
    "by_runtime",
    "per_epoch",
    "au_by_method",
    "save",
    "standard_figures",
]

#: Known methods, roughly fastest and most local first; figures order their x axes this way.
METHOD_ORDER: list[str] = [
    "local", "dataferry", "gcsfuse-cache", "gcsfuse", "api-parallel", "api-serial", "drive", "folder",
]

PASS_KINDS = ("first read", "repeat")
LAB_NOTE = "lab: offline lab profile, not a cloud measurement"
Y_LABEL = "MB/s (10^6 B/s) per epoch, log scale"
NO_DATA = "no data"

_NEEDED = ("method", "region", "runtime", "pass", "phase", "MBps", "error")
_KNOWN_COLOURS = sns.color_palette("colorblind", 10)
# Colours for methods not in METHOD_ORDER, picked to stay apart from the eight above: the colorblind
# yellow, then near-black, teal, olive, dark violet, crimson, lime and the colorblind light blue.
_EXTRA_COLOURS = [
    _KNOWN_COLOURS[8], (0.15, 0.15, 0.15), (0.0, 0.55, 0.55), (0.55, 0.55, 0.0),
    (0.35, 0.2, 0.55), (0.6, 0.0, 0.2), (0.5, 0.8, 0.3), _KNOWN_COLOURS[9],
]
_STYLE = "whitegrid"


def method_palette(methods: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """One RGB colour per method, the same in every figure whatever other methods are present.

    Known methods take the colorblind-palette colour at their index in :data:`METHOD_ORDER`. Other
    methods take a colour slot chosen by a stable hash of their name, so a method's colour does not
    depend on its neighbours; two unknown methods that hash to the same slot are separated by
    taking the next free slot in name order (only then can a colour depend on which are present).
    """
    names = sorted({str(m) for m in methods})
    palette: dict[str, tuple[float, float, float]] = {}
    unknown = []
    for name in names:
        if name in METHOD_ORDER:
            palette[name] = _rgb(_KNOWN_COLOURS[METHOD_ORDER.index(name)])
        else:
            unknown.append(name)
    taken: set[int] = set()
    overflow = []
    for name in unknown:
        start = zlib.crc32(name.encode()) % len(_EXTRA_COLOURS)
        for step in range(len(_EXTRA_COLOURS)):
            slot = (start + step) % len(_EXTRA_COLOURS)
            if slot not in taken:
                taken.add(slot)
                palette[name] = _rgb(_EXTRA_COLOURS[slot])
                break
        else:
            overflow.append(name)
    if overflow:
        for name, colour in zip(overflow, sns.color_palette("husl", len(overflow))):
            palette[name] = _rgb(colour)
    return palette


def first_vs_repeat(rows: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Box plot of epoch MB/s per method, first read next to repeat passes.

    Shows whether a method's speed comes from caching (repeat far above first read) or from the
    transfer itself. First reads are solid boxes, repeats hatched, both in the method's colour.
    """
    epochs, notes = _epochs(rows)
    own = ax is None
    if ax is None:
        fig, axes = _new_figure(1, (max(6.0, 1.3 * max(1, epochs["method"].nunique()) + 2.5), 5.0))
        ax = axes[0]
    else:
        fig = ax.figure
    ax.set_title("Epoch throughput: first read vs repeat\n" + _scope(epochs), fontsize=10)
    ax.set_xlabel("method")
    ax.set_ylabel(Y_LABEL)
    if epochs.empty:
        _no_data(ax)
    else:
        methods = _ordered_methods(epochs["method"])
        palette = method_palette(methods)
        _boxes(ax, epochs, "method", methods, "pass_kind", list(PASS_KINDS),
               lambda method, kind: palette[method], lambda method, kind: kind == "repeat")
        _log_limits([ax], epochs["MBps"])
        handles = [_patch((0.55, 0.55, 0.55), False, "first read (pass 1)"),
                   _patch((0.55, 0.55, 0.55), True, "repeat (pass >= 2)")]
        ax.legend(handles=handles, title="pass", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _finish(fig, notes, [ax], own)
    return fig


def by_region(rows: pd.DataFrame) -> Figure:
    """Box plots of epoch MB/s per region and method, one panel for first reads, one for repeats.

    Shows how far the data is from the machine matters, and for which methods.
    """
    return _faceted(rows, "region", "Epoch throughput by region")


def by_runtime(rows: pd.DataFrame) -> Figure:
    """Box plots of epoch MB/s per runtime and method, one panel for first reads, one for repeats.

    Shows whether a method's speed depends on the machine it runs on (CPU, GPU, Colab, local).
    """
    return _faceted(rows, "runtime", "Epoch throughput by runtime")


def per_epoch(rows: pd.DataFrame) -> Figure:
    """Median epoch MB/s against pass number per method, with interquartile-range bars.

    Shows how fast each method warms up: a cache should jump after pass 1 and then stay flat.
    """
    epochs, notes = _epochs(rows)
    methods = _ordered_methods(epochs["method"]) if not epochs.empty else []
    fig, axes = _new_figure(1, (8.0, 5.0))
    ax = axes[0]
    ax.set_title("Median epoch throughput per pass\n" + _scope(epochs), fontsize=10)
    ax.set_xlabel("pass (1 = first read)")
    ax.set_ylabel("median " + Y_LABEL + "\nbars: interquartile range")
    if epochs.empty:
        _no_data(ax)
    else:
        palette = method_palette(methods)
        passes = sorted(epochs["pass"].unique())
        step = min(0.08, 0.6 / len(methods))
        for j, method in enumerate(methods):
            stats = (epochs[epochs["method"] == method].groupby("pass")["MBps"]
                     .agg(median="median", q1=lambda s: s.quantile(0.25), q3=lambda s: s.quantile(0.75), n="size"))
            x = stats.index.to_numpy(dtype=float) + (j - (len(methods) - 1) / 2) * step
            med = stats["median"].to_numpy()
            yerr = np.vstack([med - stats["q1"].to_numpy(), stats["q3"].to_numpy() - med])
            n_lo, n_hi = int(stats["n"].min()), int(stats["n"].max())
            n_text = f"n={n_lo}" if n_lo == n_hi else f"n={n_lo}-{n_hi}"
            ax.errorbar(x, med, yerr=yerr, color=palette[method], marker="o", markersize=5, capsize=3,
                        linewidth=1.5, label=f"{method} ({n_text} per pass)")
        ax.set_xticks(passes)
        ax.set_xticklabels([str(p) for p in passes])
        _log_limits([ax], epochs["MBps"])
        ax.legend(title="method", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _finish(fig, notes, [ax], True)
    return fig


def au_by_method(rows: pd.DataFrame, methods: Sequence[str] | None = None, target: float = 0.9) -> Figure:
    """Accelerator utilisation of each method, epoch 1 (hatched) and later epochs (solid), from ``train``
    rows: a panel per region (columns) and compute profile (rows), a bar at the median, a dot per run,
    and a line at ``target`` (MLPerf Storage's 90% pass)."""
    import matplotlib.pyplot as plt

    ok = rows[(rows["phase"] == "train") & (rows["error"] == "") & (rows["pass"] >= 1)]
    regions, computes = sorted(ok["region"].unique()) or [""], sorted(ok["compute_profile"].unique()) or [""]
    methods = [m for m in (methods or _ordered_methods(ok["method"].unique())) if m in set(ok["method"])]
    palette = method_palette(methods)
    with sns.axes_style(_STYLE):
        fig, axes = plt.subplots(len(computes), len(regions), figsize=(4.2 * len(regions) + 1.5, 3.4 * len(computes)),
                                 sharey=True, squeeze=False)
    plt.close(fig)
    width = 0.38
    for i, compute in enumerate(computes):
        for j, region in enumerate(regions):
            ax, cell = axes[i][j], ok[(ok["compute_profile"] == compute) & (ok["region"] == region)]
            if cell.empty:
                _no_data(ax)
                continue
            for k, method in enumerate(methods):
                for later, offset in ((False, -width / 2), (True, width / 2)):
                    g = cell[(cell["method"] == method) & ((cell["pass"] > 1) == later)]["au"] * 100
                    if g.empty:
                        continue
                    c = palette[method]
                    ax.bar(k + offset, g.median(), width * 0.9, color=c if later else _lighter(c), edgecolor=_darker(c),
                           hatch=None if later else "///")
                    ax.scatter([k + offset] * len(g), g, color="black", s=8, zorder=3)
            ax.axhline(target * 100, color="tab:red", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
            ax.set_ylim(0, 105)
            ax.set_title(f"{compute}\n{region}", fontsize=9)
            if j == 0:
                ax.set_ylabel("accelerator utilisation, %")
    handles = [_patch((0.5, 0.5, 0.5), True, "epoch 1"), _patch((0.5, 0.5, 0.5), False, "later epochs"),
               Line2D([], [], color="tab:red", linestyle="--", label=f"{target:.0%} (MLPerf Storage pass)")]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False, fontsize=8)
    notes = [f"bars: median of runs; dots: each run; {_scope(ok)}" if len(ok) else NO_DATA]
    if any(str(r).startswith("lab:") for r in ok["region"]):
        notes.append(LAB_NOTE)
    fig.suptitle("Will the accelerator starve? Utilisation by method, first and later epochs", fontsize=10)
    fig.text(0.01, -0.02, "; ".join(notes), fontsize=8, style="italic", color="0.25")
    fig.tight_layout()
    return fig


def save(fig: Figure, path_without_suffix: str | Path) -> list[Path]:
    """Write ``<path>.svg`` (text kept as text, so it is searchable) and ``<path>.png`` (150 dpi).

    Creates the parent folders; returns ``[svg_path, png_path]``.
    """
    base = Path(path_without_suffix)
    base.parent.mkdir(parents=True, exist_ok=True)
    svg = base.with_name(base.name + ".svg")
    png = base.with_name(base.name + ".png")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dataferry"}):
        fig.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None})
    fig.savefig(png, format="png", dpi=150, bbox_inches="tight")
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


def _rgb(colour: Sequence[float]) -> tuple[float, float, float]:
    return (float(colour[0]), float(colour[1]), float(colour[2]))


def _epochs(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Successful epoch rows with clean types and a ``pass_kind`` column, plus footnotes on what was left out."""
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"rows must be a pandas DataFrame, not {type(rows).__name__}")
    missing = [c for c in _NEEDED if c not in rows.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing}; expected the long format of dataferry.timing.COLUMNS "
                         f"({len(COLUMNS)} columns)")
    epochs = rows[rows["phase"].astype("string").fillna("") == "epoch"]
    ok = epochs["error"].astype("string").fillna("").str.strip() == ""
    failed = int((~ok).sum())
    epochs = epochs[ok]
    mbps = pd.to_numeric(epochs["MBps"], errors="coerce").astype(float)
    passes = pd.to_numeric(epochs["pass"], errors="coerce").astype(float)
    usable = (mbps > 0) & np.isfinite(mbps) & (passes >= 1)
    unusable = int((~usable).sum())
    out = pd.DataFrame({
        "method": _labels(epochs["method"]),
        "region": _labels(epochs["region"]),
        "runtime": _labels(epochs["runtime"]),
        "pass": passes,
        "MBps": mbps,
    })[usable.to_numpy()]
    out["pass"] = out["pass"].astype(int)
    out["pass_kind"] = np.where(out["pass"] == 1, PASS_KINDS[0], PASS_KINDS[1])
    notes = []
    if (out["region"].str.startswith("lab:")).any():
        notes.append(LAB_NOTE)
    if failed:
        notes.append(f"left out: {failed} failed epoch row(s) (error set)")
    if unusable:
        notes.append(f"left out: {unusable} epoch row(s) without a positive MB/s or a pass number")
    return out.reset_index(drop=True), notes


def _labels(values: pd.Series) -> pd.Series:
    text = values.astype("string").fillna("").str.strip()
    return text.mask(text == "", "(blank)").astype(str)


def _ordered_methods(methods: Iterable[str]) -> list[str]:
    present = set(methods)
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def _listing(values: Iterable[str], most: int = 4) -> str:
    names = sorted(set(values))
    if not names:
        return "none"
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} +{len(names) - most} more"


def _scope(epochs: pd.DataFrame) -> str:
    return f"regions: {_listing(epochs['region'])}; runtimes: {_listing(epochs['runtime'])}"


def _new_figure(ncols: int, size: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    import matplotlib.pyplot as plt

    with sns.axes_style(_STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=size, sharey=True, squeeze=False)
    plt.close(fig)  # detached: no second display in Jupyter, no figure kept alive by pyplot
    return fig, list(axes[0])


def _close(fig: Figure) -> None:
    """Let pyplot forget the figure; its memory goes with the last reference. (``fig.clear()`` on
    shared log axes warns "non-positive ylim" in matplotlib 3.10, Colab's version.)"""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close(fig)


def _no_data(ax: Axes, clear_y: bool = True) -> None:
    """Write "no data" across the axes; ``clear_y=False`` keeps y ticks a sharing panel still uses."""
    ax.set_yscale("log")
    ax.set_ylim(1, 1000)
    ax.set_xticks([])
    if clear_y:
        ax.set_yticks([])
        ax.set_yticks([], minor=True)
    ax.text(0.5, 0.5, NO_DATA, transform=ax.transAxes, ha="center", va="center", fontsize=16, color="0.4")


def _lighter(colour: tuple[float, float, float], share: float = 0.55) -> tuple[float, float, float]:
    return _rgb([c + (1.0 - c) * share for c in colour])


def _darker(colour: tuple[float, float, float], share: float = 0.45) -> tuple[float, float, float]:
    return _rgb([c * (1.0 - share) for c in colour])


def _patch(colour: tuple[float, float, float], hatched: bool, label: str) -> Patch:
    face = _lighter(colour) if hatched else colour
    return Patch(facecolor=face, edgecolor=_darker(colour), hatch="///" if hatched else None, label=label)


def _boxes(ax: Axes, data: pd.DataFrame, x_col: str, x_levels: list[str], hue_col: str, hue_levels: list[str],
           colour: Callable[[str, str], tuple[float, float, float]], hatched: Callable[[str, str], bool]) -> None:
    """Dodged box plots, one per (x, hue) group that has data, each with ``n=`` written above it."""
    width = 0.8 / len(hue_levels)
    crowded = len(hue_levels) > 3
    for i, x_value in enumerate(x_levels):
        for j, hue_value in enumerate(hue_levels):
            values = data.loc[(data[x_col] == x_value) & (data[hue_col] == hue_value), "MBps"].to_numpy()
            if values.size == 0:
                continue
            pos = i - 0.4 + width * (j + 0.5)
            face = colour(x_value, hue_value)
            hatch = hatched(x_value, hue_value)
            edge = _darker(face)
            parts = ax.boxplot(
                [values], positions=[pos], widths=width * 0.85, patch_artist=True, manage_ticks=False,
                boxprops={"facecolor": _lighter(face) if hatch else face, "edgecolor": edge, "linewidth": 1.0},
                medianprops={"color": "black", "linewidth": 1.5},
                whiskerprops={"color": edge}, capprops={"color": edge},
                flierprops={"marker": "o", "markersize": 3, "markerfacecolor": face, "markeredgecolor": edge},
            )
            if hatch:
                parts["boxes"][0].set_hatch("///")
            ax.annotate(f"n={values.size}", xy=(pos, float(values.max())), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=90 if crowded else 0, gid="n-label")
    ax.set_xticks(range(len(x_levels)))
    rotate = len(x_levels) > 4 or max((len(x) for x in x_levels), default=0) > 14
    ax.set_xticklabels(x_levels, rotation=25 if rotate else 0, ha="right" if rotate else "center")
    ax.set_xlim(-0.5, len(x_levels) - 0.5)


def _log_limits(axes: Sequence[Axes], values: pd.Series) -> None:
    """Log y axis over the data with headroom above for the n labels; plain-number tick labels."""
    lo, hi = np.log10(float(values.min())), np.log10(float(values.max()))
    span = max(hi - lo, 0.5)
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylim(10 ** (lo - 0.08 * span), 10 ** (hi + 0.2 * span))
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(mticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


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


def _faceted(rows: pd.DataFrame, x_col: str, title: str) -> Figure:
    """Shared body of :func:`by_region` and :func:`by_runtime`: x = ``x_col``, hue = method, a panel per pass kind."""
    epochs, notes = _epochs(rows)
    x_levels = sorted(epochs[x_col].unique()) if not epochs.empty else []
    methods = _ordered_methods(epochs["method"]) if not epochs.empty else []
    palette = method_palette(methods)
    panel_width = max(4.5, 0.8 + len(x_levels) * max(1.2, 0.3 * len(methods)))
    fig, axes = _new_figure(len(PASS_KINDS), (2 * panel_width + 2.0, 5.2))
    for ax, kind in zip(axes, PASS_KINDS):
        subset = epochs[epochs["pass_kind"] == kind]
        ax.set_title("first read (pass 1)" if kind == PASS_KINDS[0] else "repeat (pass >= 2)", fontsize=10)
        ax.set_xlabel(x_col)
        if subset.empty:
            _no_data(ax, clear_y=epochs.empty)
        else:
            _boxes(ax, subset, x_col, x_levels, "method", methods,
                   lambda x_value, method: palette[method], lambda x_value, method: False)
    axes[0].set_ylabel(Y_LABEL)
    if not epochs.empty:
        _log_limits(axes, epochs["MBps"])
        handles = [Line2D([], [], color=palette[m], marker="s", markersize=9, linestyle="", label=m) for m in methods]
        axes[-1].legend(handles=handles, title="method", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{title}\n{_scope(epochs)}", fontsize=11)
    _finish(fig, notes, axes, True)
    return fig
