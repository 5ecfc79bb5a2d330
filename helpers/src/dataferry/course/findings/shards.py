"""Lesson 09's findings: shards streamed through a cache smaller than them, a resumed epoch, and the
side-by-side with files through the cache and webdataset's own cache."""

from __future__ import annotations

import statistics
from typing import Any

from dataferry.course.findings import MIN_REPEATS, Conclusion, mb

__all__ = ["streaming", "readers"]


def streaming(where: str, epochs: Any, peak: int, budget: int, shard_bytes: int, shards: int,
              resumed: list[str], uninterrupted: list[str], keys: list[str], disconnect_at: int,
              local: bool = False) -> Conclusion:
    """``epochs``: :func:`dataferry.course.lessonshards.stream_epochs`'s table; ``resumed``: the keys read before a
    disconnect and after the restart, in order; ``uninterrupted``: the same epoch's keys without one."""
    said = [f"The cache stayed {'within' if peak <= budget else 'OVER'} its budget: {mb(peak)} at most of {mb(budget)}, "
            f"for {mb(shard_bytes)} of shards ({shard_bytes / budget:.1f}x the budget)."]
    fetched = epochs["shards fetched"].astype(int).tolist()
    kept = epochs["kept after (shards)"].astype(int).tolist()
    got = "copied" if local else "downloaded"
    said.append(f"Epoch 1 {got} {fetched[0]} of {shards} shards"
                + (" from the local shard folder (no network here)." if local else "."))
    for n in range(1, len(fetched)):
        reused = shards - fetched[n]
        said.append(f"Epoch {n + 1} {got} {fetched[n]}: of the {kept[n - 1]} shards kept after epoch {n}, {reused} were "
                    "read from disk" + ("." if reused >= kept[n - 1] else "; the shards read ahead pushed the others "
                                        "out before their turn."))
    once = sorted(resumed) == sorted(keys)
    said.append(f"After a disconnect at batch {disconnect_at}, the resumed epoch read "
                + ("every sample exactly once, in the order of an uninterrupted epoch." if once and resumed == uninterrupted
                   else "every sample exactly once, in another order." if once else "NOT every sample exactly once."))
    return Conclusion(where, said)


def _per_run_later(runs: list[dict[str, Any]]) -> list[float]:
    """One value per run, its later epochs' median samples/s: epochs of one run share a process and a cache."""
    return [statistics.median(e["samples"] / e["seconds"] for e in runs if e["epoch"] > 1 and e["repeat"] == r)
            for r in sorted({e["repeat"] for e in runs if e["epoch"] > 1})]


def readers(where: str, summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]], repeats: int,
            cleanup_s: float | None) -> Conclusion:
    """``summary``/``runs``: :func:`dataferry.course.lessonshards.compare_readers`'s; ``cleanup_s``: webdataset's
    ``FileCache`` clean-up interval (None without webdataset)."""
    from dataferry.harness.stats import speedup

    said = ["Epoch 1, samples/s (median over the runs): "
            + ", ".join(f"{m} {s['first_samples_per_s']:,.0f}" for m, s in summary.items()) + "."]
    later = {m: s["later_samples_per_s"] for m, s in summary.items() if s["later_samples_per_s"]}
    if len(later) > 1:
        ranked = sorted(later, key=lambda m: later[m], reverse=True)
        head = "Later epochs, samples/s: " + ", ".join(f"{m} {later[m]:,.0f}" for m in ranked)
        per_run = {m: _per_run_later(runs[m]) for m in ranked[:2]}
        if min(map(len, per_run.values())) < MIN_REPEATS:
            said.append(head + f"; {ranked[0]} against {ranked[1]}: too few runs for an interval.")
        else:
            lead, low, high = speedup(per_run[ranked[0]], per_run[ranked[1]])
            said.append(head + f"; {ranked[0]} led {ranked[1]} by {lead:.2f}x [95% CI {low:.2f}, {high:.2f}]"
                        + ("." if low > 1 else ": an interval that takes in 1, so not told apart here."))
        said.append("Served by the bucket per later epoch (median): "
                    + ", ".join(f"{m} {summary[m]['later_served_MB']:.1f} MB" for m in ranked) + ".")
    said.append("Most cached data on disk in any run, over the budget: "
                + ", ".join(f"{m} {s['peak_disk_vs_budget']:.2f}x" for m, s in summary.items()) + ".")
    if "webdataset-cache" in runs and cleanup_s is not None:
        longest = max(e["seconds"] for e in runs["webdataset-cache"])
        if longest < cleanup_s:
            said.append(f"webdataset's cache cleans up when its folder first passes the budget, then not again for "
                        f"{cleanup_s:g} s (FileCache's default); its epochs lasted {longest:.1f} s at most, so after "
                        "each pipeline's first clean-up its disk use grew past the budget unchecked.")
        else:
            said.append(f"webdataset's epochs lasted up to {longest:.1f} s, past its {cleanup_s:g} s clean-up interval: "
                        "it cleaned up again within an epoch, so its budget was applied between clean-ups.")
    if repeats < 5:
        said.append(f"Only {repeats} run(s) of each: these medians say little (the course's rule is at least 5).")
    return Conclusion(where, said)
