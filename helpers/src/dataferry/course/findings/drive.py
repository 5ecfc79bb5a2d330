"""Lesson 01's findings: a big folder listed two ways, Drive's (or its stand-in's) first read against its
re-read, and one archive copied to local disk against the files read one by one."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion
from dataferry.course.findings import interval as _interval
from dataferry.course.findings import judged as _judged

__all__ = ["STAT_COSTS", "LOCAL_REPEAT", "EXTRAPOLATE_TO", "listing", "first_vs_repeat", "archive"]

#: ``os.listdir`` + ``os.stat`` taking this many times ``os.scandir``'s time or more: the stat per file costs.
STAT_COSTS = 1.1
#: A re-read this many times the first read's speed or more was served by something local.
LOCAL_REPEAT = 2.0
#: The folder size the stat's cost per file is extrapolated to, said as an extrapolation.
EXTRAPOLATE_TO = 100_000

_FRESH_RUNTIME = "Runtime > Disconnect and delete runtime, then run this lesson again"


def _few(repeats: int) -> list[str]:
    return [f"Only {repeats} repetition(s): the intervals say little (the course's rule is at least 5)."] \
        if repeats < 5 else []


def listing(listed: Any, where: str, on_drive: bool, repeats: int) -> Conclusion:
    """``listed``: :meth:`DriveFiles.listings` rows (``method``, ``pass``, ``ms``, ``file`` "(N entries)"). A stand-in
    compares first listings on fresh mounts (pass 1); Drive, which cannot be made cold, listings again (pass 2)."""
    compared = 2 if on_drive else 1
    rows = listed[listed["pass"] == compared]
    slow, fast = (rows.loc[rows["method"] == m, "ms"] for m in ("os.listdir + os.stat", "os.scandir"))
    if slow.empty or fast.empty:
        return Conclusion(where, ["No listing of both ways was timed: see the rows above."])
    n = int(str(listed["file"].iloc[-1]).strip("(").split()[0])
    r, lo, hi = _interval(slow, fast)
    per_file_us = (slow.median() - fast.median()) / n * 1e3
    what = "listings again on Drive" if on_drive else "first listings on a fresh mount"
    said = [f"Over {what} of {n} files, os.scandir took a median {fast.median():.0f} ms and os.listdir + os.stat "
            f"{slow.median():.0f} ms: the second way took "
            + _judged(r, lo, hi, STAT_COSTS,
                      f"the stat per file cost about {per_file_us:.0f} us. For a folder of {EXTRAPOLATE_TO:,} files "
                      f"that would be about {per_file_us * EXTRAPOLATE_TO / 1e6:.0f} s more per listing (an "
                      "extrapolation, not a measurement): list with os.scandir, or os.walk, which uses it.",
                      "the two ways cost about the same: the daemon answered each stat from metadata it had just "
                      "listed.", " os.scandir's time", n=min(len(slow), len(fast)))]
    if on_drive:
        first = listed.loc[listed["pass"] == 1, "ms"]
        if len(first):
            said.append(f"The first listing of this run took {first.iloc[0]:.0f} ms. Drive cannot be made cold from "
                        "inside a runtime, so the ways were compared on listings again.")
    else:
        again = listed[listed["pass"] == 2].groupby("method")["ms"].median()
        first_ms = rows.groupby("method")["ms"].median()
        said.append("Listing again on the same mount took " + ", ".join(
            f"{again[m]:.0f} ms with {m} (first: {first_ms[m]:.0f} ms)" for m in again.index if m in first_ms) + ".")
    return Conclusion(where, said + _few(repeats))


def _epochs(rows: Any, method: str) -> tuple[Any, Any, bool]:
    """First reads, re-reads, and whether every re-read followed a verified eviction (a warm state, not cold_unverified)."""
    ok = rows[(rows["phase"] == "epoch") & (rows["error"].fillna("") == "") & (rows["method"] == method)]
    again = ok[ok["pass"] >= 2]
    return ok[ok["pass"] == 1]["MBps"], again["MBps"], bool((again["cache_state"] == "daemon_warm").all())


def _times(r: float) -> str:
    return f"{r:.1f}x" if r < 10 else f"{r:.0f}x"


def first_vs_repeat(rows: Any, where: str, on_drive: bool, fresh: bool, repeats: int) -> Conclusion:
    """``rows``: :meth:`DriveFiles.reads` (method ``drive``, or ``gcsfuse-cache`` on a stand-in); ``fresh``: nothing
    in this runtime wrote or read the files before the first read."""
    first, again, checked = _epochs(rows, "drive" if on_drive else "gcsfuse-cache")
    if first.empty or again.empty:
        return Conclusion(where, ["No usable first/repeat pair was measured: see the error rows above."])
    speeds = (f"The first read ran at a median {first.median():.1f} MB/s per epoch and the re-read at "
              f"{again.median():.0f} MB/s")
    if on_drive and not fresh:
        return Conclusion(where, [
            f"{speeds}. This runtime wrote or read these files before the first read, so both may have come from "
            "what Drive keeps on the runtime: this run cannot say what a first read from Drive costs.",
            f"For a true first read: {_FRESH_RUNTIME} (the sample stays on your Drive)."] + _few(repeats))
    evicted = ("(the page cache was evicted, and checked)" if checked else
               "(but the page cache could not be checked empty: RAM may have served part of it)")
    served = (f"Drive's daemon kept the files on the runtime itself {evicted}. What it keeps, and for how long, "
              "Google does not document." if on_drive else
              f"the re-read came from gcsfuse's file cache on the runtime {evicted}, not from the network: its files "
              "on local disk, or the kernel's copy of them in RAM. Epoch 2 onwards needs no network; what stays slow "
              "is epoch 1.")
    said = [f"{speeds}, " + _judged(*_interval(again, first), LOCAL_REPEAT, served,
                                    "nothing local served the re-read: every epoch crosses the network again.",
                                    " the first read's speed", n=len(again) if on_drive else min(len(first), len(again)))]
    if on_drive:
        said.append("Drive cannot be emptied from inside a runtime, so this run has one first read: the interval "
                    "covers the re-reads only.")
        said.append("The 2020 post found Drive's re-read \u201cmore than 1000x faster\u201d without checking that it "
                    "had left RAM (lesson 00); with the page cache evicted"
                    + (" and checked" if checked else "") + f", it was {_times(again.median() / first.median())} here.")
    else:
        said.append("The 2020 post's \u201cmore than 1000x\u201d re-read is Drive's, which this stand-in does not "
                    "model: its first-read speed, per-file latency and what it keeps are Drive's own.")
    return Conclusion(where, said + _few(repeats))


def archive(archives: Any, where: str, on_drive: bool, cap_MBps: float | None, repeats: int,  # noqa: N803
            why_not: str = "") -> Conclusion:
    """``archives``: :meth:`DriveFiles.archives` rows (``way``, ``seconds``, and for an archive ``extract_s`` and
    ``local_bytes``); ``cap_MBps``: the lab profile's bandwidth per connection (None: not the lab's)."""
    if archives is None or len(archives) == 0:
        return Conclusion(where, [why_not or "No archive was compared."])
    secs = {way: g["seconds"] for way, g in archives.groupby("way")}
    packed = sorted((w for w in secs if ":" in w), key=lambda w: secs[w].median())
    best = packed[0]
    kind = best.split(":")[0]
    steps = archives[archives["way"] == best]
    said = [f"Copying the {kind} to local disk, extracting and reading it took a median {secs[best].median():.2f} s; "
            f"extracting was {steps['extract_s'].median() / steps['seconds'].median():.0%} of it, and the disk held "
            f"the archive and its files at once, {steps['local_bytes'].max() / 1e6:.1f} MB at the peak."]
    if "files through the mount" in secs:
        files = secs["files through the mount"]
        said.append(f"The same files read through the mount, 16 at a time, took {files.median():.2f} s: "
                    + _judged(*_interval(files, secs[best]), 1.0, "the archive was faster.",
                              "the files through the mount were faster.", f" the {kind}'s time", n=len(files)))
    if "dataferry stage" in secs:
        staged = secs["dataferry stage"]
        said.append(f"Staging the files from the bucket with dataferry took {staged.median():.2f} s: "
                    + _judged(*_interval(staged, secs[best]), 1.0, "the archive was faster.",
                              "staging was faster, and keeps every file verified.", f" the {kind}'s time",
                              n=len(staged)))
    if cap_MBps:
        said.append(f"Every connection of this lab profile is capped at {cap_MBps:g} MB/s, a profile input: this "
                    "compares one stream with 16 under that cap, which is not what Drive does.")
    if on_drive:
        said.append("On Drive this comparison favours the files: section 3 read them already, and Drive kept what "
                    "earlier repetitions read, so only an archive's first repetition, in a fresh runtime, is a first "
                    "read.")
    said.append("The archive has to be uploaded again whenever one file in it changes; files and staging do not.")
    return Conclusion(where, said + _few(repeats))
