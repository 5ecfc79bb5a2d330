"""Lesson 06's findings: what the layout (many small files or few large objects) and the requests in flight
did to reading every sample once, and a size rule fitted from the run: per-request latency x bandwidth."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion, mb

__all__ = ["SHARDS_FASTER", "PARALLEL_FASTER", "WAITING", "COMBINE", "fit", "layouts"]

#: Shards read one by one at least this much faster than files one by one are "faster".
SHARDS_FASTER = 1.2
#: Requests in flight at least this much faster than one by one "hide latency".
PARALLEL_FASTER = 1.5
#: A file that spent at least this share of its time waiting was bound by its request, not its bytes.
WAITING = 0.5
#: Both fixes together at least this much above the better one alone "combine".
COMBINE = 1.1


def fit(s_file: float, t_file: float, s_large: float, t_large: float) -> tuple[float, float, bool]:
    """(latency s, bandwidth B/s, fitted): the line ``t = latency + s / bandwidth`` through a file's and a large
    object's median time; where the two points cannot fix it, bounds (latency <= a file's time, bandwidth >=
    a large object's rate) and False."""
    if t_large > t_file and s_large > s_file:
        bandwidth = (s_large - s_file) / (t_large - t_file)
        latency = t_file - s_file / bandwidth
        if latency > 0:
            return latency, bandwidth, True
    return t_file, s_large / t_large, False


def layouts(rows: Any, where: str, *, files: int, large: int, s_file: float, s_large: float, shards: bool,
            parallel: int, profile: Any, repeats: int, locations: tuple[str, str] = ("", "")) -> Conclusion:
    """``rows``: :func:`dataferry.course.lessonlayouts.measure_layouts`'s; ``profile``: the lab's (None elsewhere)."""
    big = "shards" if shards else "large objects"
    serial_small, parallel_small = "files, one by one", f"files, {parallel} at a time"
    serial_large, parallel_large = f"{big}, one by one", f"{big} in parallel"
    reads = rows[rows["kind"] == "read"]
    med, rate = reads.groupby("how")["seconds"].median(), reads.groupby("how")["MBps"].median()
    requests = reads.groupby("how")["requests"].median()
    t_file, t_large = med[serial_small] / files, med[serial_large] / large
    latency, bandwidth, fitted = fit(s_file, t_file, s_large, t_large)
    wait = latency / t_file
    said = [] if fitted else ["The two-point fit failed on these numbers; bounds are used: latency at most a file's "
                              "time, bandwidth at least a large object's rate."]
    said.append(f"One request cost about {latency * 1e3:.0f} ms before data flowed, and one connection carried about "
                f"{bandwidth / 1e6:.0f} MB/s" + (f" (the profile assumes +{profile.rtt_ms:g} ms and "
                                                 f"{profile.bandwidth_MBps:g} MB/s)." if profile is not None and
                                                 profile.bandwidth_MBps else "."))
    said.append(f"One request after another, each {s_file / 1024:.0f} KiB file took {t_file * 1e3:.1f} ms, {wait:.0%} of "
                "it waiting: " + ("the count of requests, not the bytes, decided how long the files took."
                                  if wait >= WAITING else "at this size the bytes weighed as much as the requests."))
    if shards:
        speed = med[serial_small] / med[serial_large]
        said.append(f"Every sample one request after another: {med[serial_small]:.2f} s as files "
                    f"({requests[serial_small]:.0f} requests), {med[serial_large]:.2f} s as shards "
                    f"({requests[serial_large]:.0f}): " + (f"shards were {speed:.1f}x faster." if speed >= SHARDS_FASTER
                                                          else f"only {speed:.2f}x apart."))
    else:
        said.append(f"One request after another, the {files} files moved {rate[serial_small]:.1f} MB/s and the {large} "
                    f"large objects {rate[serial_large]:.1f} MB/s: per byte, the large objects were "
                    f"{rate[serial_large] / rate[serial_small]:.1f}x faster (other data: compare rates, not times).")
    pspeed = med[serial_small] / med[parallel_small]
    if pspeed >= PARALLEL_FASTER:
        said.append(f"{parallel} requests in flight read the files {pspeed:.1f}x faster than one by one: parallelism hides "
                    "latency without changing the layout.")
    else:
        said.append(f"{parallel} requests in flight read the files only {pspeed:.2f}x as fast as one by one: "
                    + ("yet each file spent most of its time waiting, so something other than latency held them back "
                       "(the link's bandwidth, or this machine)." if wait >= WAITING else
                       "there was little latency to hide."))
    in_flight, larger = rate[parallel_small] / rate[serial_small], rate[serial_large] / rate[serial_small]
    both = rate[parallel_large] / rate[serial_small]
    said.append(f"Against files one by one, in MB/s: requests in flight {in_flight:.1f}x, {serial_large} {larger:.1f}x, "
                f"{parallel_large} {both:.1f}x" + (": the two fixes combine." if both > COMBINE * max(in_flight, larger)
                                                   else ": they did not add up; one fix alone reached the limit here."))
    balance = latency * bandwidth
    said.append(f"Balance size (latency x bandwidth): {mb(balance)}; objects of {mb(9 * balance)} or more spend 90% of "
                f"their time moving bytes, and the {big} here were {mb(s_large)} each on average"
                + (": under a lab profile this shows the method, not a size for your cloud." if profile is not None
                   else "."))
    lists = rows[rows["kind"] == "list"].groupby("how")[["seconds", "requests"]].median()
    pages, seconds = lists.loc["list files", "requests"], lists.loc["list files", "seconds"]
    said.append(f"Listing the files' folder (every object under it) took {pages:.0f} request(s) in {seconds:.2f} s, "
                f"and the {big} {lists.loc[f'list {big}', 'requests']:.0f}; GCS lists 1000 objects a page, pages one "
                f"after another: a million files take 1000 pages, at least {1000 * seconds / max(pages, 1):.0f} s at "
                "this run's time per page (a full page holds more than this run's may have).")
    if not shards and (locations[0] != locations[1] or "unknown" in locations):
        said.append("The small files and the large objects sit in different (or unknown) locations, so the fit mixes "
                    "two links: read its latency and bandwidth as rough.")
    if repeats < 5:
        said.append(f"Only {repeats} repetition(s): these medians say little (the course's rule is at least 5).")
    return Conclusion(where, said)
