"""Figures a lesson draws of its own run (not of result rows): one function per figure, returned detached
from pyplot like the standard figures, so a lesson's cell shows the call and the figure, not the drawing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from dataferry.cache.counters import CacheStats

__all__ = ["archive_times", "cache_budget", "epoch_times", "listing_times", "gcsfuse_knobs", "layouts", "save_times", "shards_disk_and_network", "warm_vs_cold"]


def cache_budget(usage: Sequence[int], budget: int, data_bytes: int, passes: Sequence[CacheStats],
                 where: str) -> Figure:
    """Lesson 05: the cache's bytes after each read of two passes against ``max_bytes``, and each pass's
    hits and misses (pass 3 rereads only what was kept)."""
    import matplotlib.pyplot as plt

    fig, (ax, counts) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    plt.close(fig)
    n = len(usage) // 2
    ax.axhline(budget / 1e6, color="tab:red", linestyle="--", label=f"max_bytes = {budget / 1e6:.1f} MB")
    ax.plot(np.arange(1, len(usage) + 1), np.array(usage) / 1e6, color="tab:blue", drawstyle="steps-post",
            marker=".", markersize=3, zorder=3, label="cache usage after each read")
    ax.axhline(data_bytes / 1e6, color="0.5", linestyle=":", label=f"dataset = {data_bytes / 1e6:.1f} MB")
    ax.axvline(n + 0.5, color="0.7", linewidth=0.8)
    ax.set_xlabel(f"reads (pass 1: 1-{n}, pass 2: {n + 1}-{2 * n})")
    ax.set_ylabel("MB in the cache")
    ax.set_ylim(0, data_bytes / 1e6 * 1.1)
    ax.set_title(f"A byte budget: LRU keeps the cache under max_bytes ({where})", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    hits, misses = [p.hits for p in passes], [p.misses for p in passes]
    x = range(len(passes))
    counts.bar(x, hits, 0.6, color="tab:green", label="hits (read from the cache)")
    counts.bar(x, misses, 0.6, bottom=hits, color="tab:red", alpha=0.7, label="misses (downloaded)")
    for i, (h, m) in enumerate(zip(hits, misses)):
        counts.annotate(f"{h} hits\n{m} misses", (i, h + m), xytext=(0, 3), textcoords="offset points", ha="center",
                        fontsize=8)
    counts.set_xticks(list(x), ["pass 1", "pass 2\n(same order)", "pass 3\n(only what is kept)"][:len(passes)],
                      fontsize=8)
    counts.set_ylabel("reads")
    counts.set_ylim(0, max(h + m for h, m in zip(hits, misses)) * 1.3)
    counts.set_title("Hits and misses per pass", fontsize=10)
    counts.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig


def save_times(saves: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 10: seconds per checkpoint save, by place and way (lines: medians; dots: each save)."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots

    colours = {"torch.save": "tab:red", "Checkpoints": "tab:blue"}
    labels = saves["way"] + "\ninto the " + saves["place"]
    fig, ax = plt.subplots(figsize=(8, 4))
    plt.close(fig)
    medians_and_dots(ax, saves.assign(label=labels), "seconds", by="label", log=False,
                     colours={label: colours[way] for label, way in zip(labels, saves["way"])})
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("seconds to save one checkpoint\n(lines: median; dots: each save)")
    ax.set_title(title, fontsize=10)
    return finish(fig, lab=lab)


def warm_vs_cold(reads: pd.DataFrame, title: str) -> Figure:
    """Lesson 00: per-file MB/s of cold reads (after eviction) and warm ones, as boxes on a log axis."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.figures import log_axis
    from dataferry.harness.plots.palette import method_palette

    colour = method_palette(["local"])["local"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    plt.close(fig)
    for x, kind in enumerate(("cold", "warm")):
        rows = reads[reads["read"] == kind]
        values = rows["MBps"].to_numpy(float)
        box = ax.boxplot([values], positions=[x], widths=0.5, patch_artist=True,
                         medianprops={"color": "black", "linewidth": 1.5})
        box["boxes"][0].set_facecolor(colour if kind == "cold" else (1.0, 1.0, 1.0))
        box["boxes"][0].set_edgecolor(colour)
        ax.annotate(f"n={values.size}", xy=(x, values.max()), xytext=(0, 4), textcoords="offset points",
                    ha="center", fontsize=8)
    states = ["/".join(sorted(reads.loc[reads["read"] == k, "cache_state"].unique())) for k in ("cold", "warm")]
    ax.set_xticks([0, 1], [f"cold: read after evict()\n({states[0]})", f"warm: read again\n({states[1]})"])
    log_axis(ax)
    ax.set_ylabel("MB/s (10^6 B/s) per file, log scale")
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def gcsfuse_knobs(runs: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 02: each knob's first reads and re-reads (left) and second listing (right), every repetition a dot."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots

    knobs = list(dict.fromkeys(runs["knob"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    plt.close(fig)
    for kind, offset, colour in (("first read MB/s", -0.18, "tab:orange"), ("repeat MB/s", 0.18, "tab:green")):
        medians_and_dots(ax1, runs, kind, by="knob", colours=dict.fromkeys(knobs, colour), offset=offset,
                         width=0.28, label=kind.replace(" MB/s", ""), counts=False)
    medians_and_dots(ax2, runs, "second listing ms", by="knob", colours=dict.fromkeys(knobs, "tab:purple"))
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(knobs)), knobs, rotation=12, ha="right", fontsize=8)
    ax1.set_ylabel("MB/s (10^6 B/s), large files\n(lines: median; dots: each repetition)")
    ax2.set_ylabel("second listing of the folder, ms")
    ax1.legend(fontsize=8, loc="upper left")
    ax1.set_title("reads, with gcsfuse's file cache", fontsize=10)
    ax2.set_title("listing the folder again", fontsize=10)
    fig.suptitle(title, fontsize=11)
    return finish(fig, lab=lab)


def shards_disk_and_network(epochs: pd.DataFrame, disk: pd.DataFrame, budget: int, shard_bytes: int,
                            title: str) -> Figure:
    """Lesson 09: the cache's bytes on disk against the budget (left), and the megabytes each epoch fetched."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    plt.close(fig)
    ax1.plot(disk["seconds"], disk["bytes"] / 1e6, lw=1, label="cache bytes (its index; fills counted)")
    ax1.axhline(budget / 1e6, color="tab:red", ls="--", label="budget")
    for t in epochs["ends at (s)"][:-1]:
        ax1.axvline(t, color="grey", lw=0.6)
    ax1.set(xlabel="seconds", ylabel="MB", title=f"disk use, {len(disk)} readings")
    ax1.legend(loc="lower right")
    ax2.bar(epochs["epoch"], epochs["fetched MB"], color="tab:blue", alpha=0.8)
    ax2.axhline(shard_bytes / 1e6, color="black", ls=":", label="whole data set")
    ax2.set(xlabel="epoch", ylabel="MB fetched from the source", title="network per epoch", xticks=epochs["epoch"])
    ax2.legend(loc="lower right")
    fig.suptitle(title)
    return fig


def layouts(rows: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 06: each way of reading's MB/s (lines: median; dots: each repeat) and the requests it took."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots
    from dataferry.harness.plots.figures import log_axis

    reads = rows[rows["kind"] == "read"]
    order = list(dict.fromkeys(reads["how"]))
    colours = {how: ("tab:orange" if how.startswith("files") else "tab:blue") for how in order}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    plt.close(fig)
    medians_and_dots(ax1, reads, "MBps", by="how", order=order, colours=colours)
    for i, how in enumerate(order):
        req = reads[reads["how"] == how]["requests"].median()
        ax2.scatter([i], [req], color=colours[how], edgecolors="black", s=40, zorder=3)
        ax2.annotate(f"{req:.0f}", (i, req), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8)
    for ax, label in ((ax1, "MB/s (10^6 B/s) of sample bytes, log scale\nlines: median; dots: each repeat"),
                      (ax2, "requests to read every sample once, log scale")):
        ax.set_xticks(range(len(order)), order, rotation=20, ha="right")
        ax.set_ylabel(label)
    ax2.set_yscale("log")
    ax2.set_ylim(0.5, ax2.get_ylim()[1] * 2)
    log_axis(ax2)
    ax1.set_title("throughput", fontsize=10)
    ax2.set_title("requests", fontsize=10)
    fig.suptitle(title, fontsize=11)
    return finish(fig, lab=lab)


def epoch_times(epochs: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 04: seconds per epoch for each mode (lines: medians; dots: each run), on a log axis."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots
    from dataferry.harness.plots.figures import log_axis

    modes = list(dict.fromkeys(epochs["mode"]))
    numbers = sorted(epochs["epoch"].unique())
    colours = dict(zip(modes, ["tab:blue", "tab:orange"]))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    plt.close(fig)
    width = 0.38
    for i, mode in enumerate(modes):  # a log axis has no zero for a bar to start from: medians are lines
        g = epochs[epochs["mode"] == mode]
        medians_and_dots(ax, g, "seconds", by="epoch", order=numbers, offset=(i - 0.5) * width, width=width * 0.8,
                         colours=dict.fromkeys(numbers, colours[mode]), label=f"{mode} (median)", counts=False)
        if g["stage_s"].max() > 0:
            ax.annotate(f"incl. staging\n{g[g['epoch'] == 1]['stage_s'].median():.2f} s",
                        ((i - 0.5) * width, g[g["epoch"] == 1]["seconds"].max()), xytext=(0, 5),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.5)
    log_axis(ax)
    ax.set_xlabel("epoch (1 = empty cache; later: local disk, page cache dropped)")
    ax.set_ylabel("seconds per epoch, log scale\n(lines: median; dots: each run)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return finish(fig, lab=lab)


def listing_times(listed: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 01: milliseconds per listing of one folder, by way and by pass (first listing, listing again), on a
    log axis (lines: medians; dots: each listing)."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots

    passes = {1: "first listing", 2: "listing again"}
    title = f"{title}: one folder of {str(listed['file'].iloc[-1]).strip('()').split()[0]} files" if len(listed) else title
    rows = listed.assign(label=listed["method"] + "\n" + listed["pass"].map(passes))
    order = [f"{way}\n{passes[p]}" for p in (1, 2) for way in dict.fromkeys(listed["method"])
             if ((listed["pass"] == p) & (listed["method"] == way)).any()]
    fig, ax = plt.subplots(figsize=(8, 4))
    plt.close(fig)
    medians_and_dots(ax, rows, "ms", by="label", order=order,
                     colours={o: "tab:blue" if o.startswith("os.scandir") else "tab:orange" for o in order})
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("milliseconds per listing, log scale\n(lines: median; dots: each listing)")
    ax.set_title(title, fontsize=10)
    return finish(fig, lab=lab)


def archive_times(archives: pd.DataFrame, title: str, lab: bool) -> Figure:
    """Lesson 01: seconds until every byte is local and read once, by way: each archive copied and extracted, the
    files through the mount, staging (lines: medians; dots: each repetition)."""
    import matplotlib.pyplot as plt

    from dataferry.harness.plots.dots import finish, medians_and_dots

    if archives.empty:
        fig, ax = plt.subplots(figsize=(8, 1.2))
        plt.close(fig)
        ax.axis("off")
        ax.text(0.5, 0.5, f"{title}: no archive was compared in this run", ha="center", va="center", fontsize=9)
        return fig
    order = sorted(dict.fromkeys(archives["way"]), key=lambda w: (":" not in w, w != "files through the mount", w))
    colours = {w: "tab:purple" if ":" in w else "tab:green" if w == "dataferry stage" else "tab:orange" for w in order}
    fig, ax = plt.subplots(figsize=(8, 4))
    plt.close(fig)
    medians_and_dots(ax, archives, "seconds", order=order, colours=colours)
    ax.set_xticks(range(len(order)), order, rotation=15, ha="right")
    ax.set_ylabel("seconds until every byte is local and read once\n(lines: median; dots: each repetition)")
    ax.set_title(title, fontsize=10)
    return finish(fig, lab=lab)
