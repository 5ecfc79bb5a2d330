"""Lesson 02's findings: gcsfuse's re-reads with and without its file cache, what reading many files at once
buys, what a re-read without eviction measures, and what its knobs change."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion
from dataferry.course.findings import interval as _interval
from dataferry.course.findings import judged as _judged

__all__ = ["FASTER", "COSTS_LITTLE", "GAIN", "LISTING", "RAM", "POST_GCSFUSE", "cache_and_width", "without_eviction",
           "knobs"]

#: A re-read whose whole interval is this much faster than the first read "re-read faster".
FASTER = 1.5
#: The file cache's first read at this share of a first read without it or more "cost little".
COSTS_LITTLE = 0.8
#: A gain whose whole interval is above this is a gain (reading at once, parallel downloads).
GAIN = 1.2
#: A second listing this many times faster is "kept".
LISTING = 3.0
#: A second read this many times the first came from RAM.
RAM = 3.0
#: The gcsfuse version the 2020 post ran.
POST_GCSFUSE = "0.30.0"


def _epochs(rows: Any, method: str, pass_no: int) -> Any:
    ok = rows[(rows["phase"] == "epoch") & (rows["error"].fillna("") == "") & (rows["method"] == method)]
    return ok[ok["pass"] == pass_no]["MBps"]


def cache_and_width(rows: Any, where: str, files: int, repeats: int) -> Conclusion:
    """``rows``: the methods ``gcsfuse``, ``gcsfuse-serial`` and ``gcsfuse-cache``, two passes each (pass 2 after a
    verified eviction); ``files``: how many each pass read."""
    said = []
    for method, name in (("gcsfuse", "Without a file cache"), ("gcsfuse-cache", "With its file cache")):
        first, again = _epochs(rows, method, 1), _epochs(rows, method, 2)
        if first.empty or again.empty:
            said.append(f"{name}: no usable first/repeat pair was measured (see the error rows).")
            continue
        said.append(f"{name}, gcsfuse re-read at " + _judged(*_interval(again, first), FASTER,
                    "faster than its first read.", "no faster than its first read: every read crossed the link again.",
                    n=min(len(first), len(again))))
    plain, cached = _epochs(rows, "gcsfuse", 1), _epochs(rows, "gcsfuse-cache", 1)
    if len(plain) and len(cached):
        said.append("With the file cache (which writes a local copy, and in gcsfuse 3 downloads in parallel ranges), "
                    "the first read ran at " + _judged(*_interval(cached, plain), COSTS_LITTLE,
                                                       "the file cache cost the first read little.",
                                                       "the file cache slowed the first read noticeably.",
                                                       " the speed of one without it", n=min(len(plain), len(cached))))
    serial = _epochs(rows, "gcsfuse-serial", 1)
    if len(plain) and len(serial):
        width = min(16, files)
        said.append(f"Reading {width} files at a time took gcsfuse's first read to "
                    + _judged(*_interval(plain, serial), GAIN, "that part is parallelism, not the tool.",
                              "reading them at once bought nothing here.", " the speed of one file after another",
                              n=min(len(plain), len(serial))))
    if where.startswith("lab:"):
        said.append("Lab numbers, not cloud numbers: the ratios show the mechanism.")
    if repeats < 5:
        said.append(f"Only {repeats} repetition(s): the intervals say little (the course's rule is at least 5).")
    return Conclusion(where, said)


def without_eviction(reads: Any, where: str, version: str) -> Conclusion:
    """``reads``: per repetition, ``first read MB/s``, ``in RAM before the second`` (a share, from ``mincore``)
    and ``second read MB/s`` of the same files through a fresh mount without a file cache, not evicted."""
    first, again = reads["first read MB/s"].median(), reads["second read MB/s"].median()
    kept, r = reads["in RAM before the second"].median(), again / first
    said = [f"Not evicted, {kept:.0%} of the files' pages were still in RAM after the first read, and the second "
            f"read ran at {again:.1f} MB/s, {r:.2f}x the first (gcsfuse {version})."]
    if r >= RAM:
        said.append("So with this gcsfuse a re-read that is not evicted is served from the page cache, not the "
                    "bucket: it measures memory and gcsfuse's own overhead, not the link.")
    elif kept > 0.5:
        said.append("The pages were in RAM, yet the second read was not much faster: each open() through gcsfuse "
                    "dropped them (FUSE drops a file's cached pages on open unless the daemon asks to keep them).")
    else:
        said.append("The pages had not stayed in RAM, and the second read went back over the link.")
    said.append(f"The 2020 post ran gcsfuse {POST_GCSFUSE}, whose handling of the page cache this run cannot show, and "
                "whether its eviction worked cannot be verified (lesson 00): what its second read measured stays open.")
    return Conclusion(where, said)


def knobs(runs: Any, where: str, read_only: str, only: str, repeats: int) -> Conclusion:
    """``runs``: rows of ``knob`` (``file cache``, ``+ parallel downloads``, ``+ metadata and listings kept``) with
    ``first read MB/s``, ``repeat MB/s`` and ``second listing ms``; ``read_only``: what a write to a read-only
    mount of ``only`` did."""
    said = []
    base, par = (runs[runs["knob"] == k] for k in ("file cache", "+ parallel downloads"))
    if len(base) and len(par):
        said.append("Parallel downloads took the first read of large files to " + _judged(
            *_interval(par["first read MB/s"], base["first read MB/s"]), GAIN,
            "the knob pays on a large file's first read, where one stream is the limit.",
            "no gain on the first read here: one stream per file was not what limited it.", " the baseline's",
            n=min(len(par), len(base))))
    kept = runs[runs["knob"] == "+ metadata and listings kept"]
    if len(base) and len(kept):
        b, k = base["second listing ms"].median(), kept["second listing ms"].median()
        said.append(f"Keeping metadata and listings for the mount's life took the second listing from {b:.1f} to "
                    f"{k:.1f} ms, " + _judged(*_interval(base["second listing ms"], kept["second listing ms"]), LISTING,
                                             "without them every listing went back to the bucket.",
                                             "little difference here.", " faster", n=min(len(base), len(kept))))
    said.append(f"A read-only mount of only {only!r} showed just that folder, and {read_only}: safety, not speed.")
    if repeats < 5:
        said.append(f"Only {repeats} repetition(s): the intervals say little (the course's rule is at least 5).")
    return Conclusion(where, said)
