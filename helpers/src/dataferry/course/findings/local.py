"""Lesson 00's findings: the same local files read after a verified eviction and read again."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion

__all__ = ["RAM_FACTOR", "HARDLY", "warm_vs_cold"]

#: A warm/cold ratio whose whole interval is above this says a benchmark without eviction measures RAM.
RAM_FACTOR = 2.0
#: A ratio whose whole interval is below this says the page cache hardly mattered.
HARDLY = 1.25


def warm_vs_cold(kind: str, reads: Any, ratio: tuple[float, float, float], repeats: int) -> Conclusion:
    """``reads``: rows with ``read`` ("cold" or "warm"), ``cache_state`` and ``MBps``; ``ratio``: warm / cold
    median with its interval (:func:`dataferry.harness.stats.speedup`); ``kind``: the runtime's label."""
    r, low, high = ratio
    cold, warm = (reads.loc[reads["read"] == k, "MBps"] for k in ("cold", "warm"))
    said = [f"A file read after a verified eviction ran at a median {cold.median():.0f} MB/s and read again at "
            f"{warm.median():.0f} MB/s: warm / cold = {r:.1f}x [95% CI {low:.1f}, {high:.1f}], {len(cold)} reads each."]
    verified = (reads.loc[reads["read"] == "cold", "cache_state"] == "cold_verified").mean()
    if verified < 1:
        said.append(f"Only {verified:.0%} of the cold reads had a verified eviction: the rest are cold_unverified, "
                    "and the cold median may be too fast.")
    if low > RAM_FACTOR:
        said.append(f"A benchmark that re-reads files without evicting them measures RAM, not this disk: it would "
                    f"overstate the disk about {r:.0f}x. That is why every row states its cache state.")
    elif high < HARDLY:
        said.append("Warm and cold reads hardly differed: this disk is probably cached below the VM too. Across a "
                    "network (lessons 01-03) a cold read costs far more.")
    elif low <= RAM_FACTOR <= high:
        said.append(f"The interval straddles {RAM_FACTOR:g}x: this run cannot say whether the page cache more than "
                    "doubles this disk's speed; raise REPEATS.")
    else:
        said.append(f"The page cache helped modestly ({r:.1f}x): this disk is fast, or cached below the VM.")
    said.append("These are local reads on this runtime: neither cloud numbers nor lab numbers.")
    if repeats < 5:
        said.append(f"Only {repeats} round(s): the interval says little (the course's rule is at least 5).")
    return Conclusion(kind, said)
