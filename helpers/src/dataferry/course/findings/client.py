"""Lesson 03's findings: one by one or in parallel, the CLI beside the client, and downloads under faults."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion, interval, judged, mb

__all__ = ["FASTER", "STARTUP", "TRANSFER", "serial_vs_parallel", "copies", "faults"]

#: Parallel downloads whose whole interval is this much faster than one by one are "faster".
FASTER = 1.5
#: The CLI's one-object floor at this share of its whole copy or more: its MB/s measures its start-up.
STARTUP = 0.6
#: ... at this share or less: the transfer took most of its time (between the two: about half each).
TRANSFER = 0.4


def serial_vs_parallel(rows: Any, where: str, workers: int, file_bytes: int | None, profile: Any,
                       repeats: int) -> Conclusion:
    """``rows``: ``api-serial`` and ``api-parallel`` epochs and downloads; ``profile``: the lab's profile (None in
    the cloud), whose round trip and bandwidth split a one-by-one download into waiting and moving bytes."""
    ok = rows[rows["error"].fillna("") == ""]
    first = ok[(ok["phase"] == "epoch") & (ok["pass"] == 1)]
    serial, parallel = (first.loc[first["method"] == m, "MBps"] for m in ("api-serial", "api-parallel"))
    if serial.empty or parallel.empty:
        return Conclusion(where, ["One of the methods produced no usable first read; see the error rows."])
    said = [f"First read: one by one {serial.median():.1f} MB/s, {workers} in parallel {parallel.median():.1f} MB/s "
            f"(medians of {len(serial)} and {len(parallel)} epochs).",
            "Parallel downloads ran at " + judged(*interval(parallel, serial), FASTER, "faster: their waits overlap.",
                                                  "not clearly faster here.", " one by one's",
                                                  n=min(len(serial), len(parallel)))]
    per_file = ok[(ok["phase"] == "download") & (ok["method"] == "api-serial")]["ns"].astype(float) / 1e6
    if len(per_file) and profile is not None and file_bytes:
        moving = file_bytes / (profile.bandwidth_MBps * 1e6) * 1e3 if profile.bandwidth_MBps else 0.0
        waiting = max(0.0, 1 - moving / per_file.median())
        said.append(f"Each one-by-one download took a median {per_file.median():.0f} ms; moving {file_bytes / 2**10:.0f} "
                    f"KiB at the profile's {profile.bandwidth_MBps or 'unlimited'} MB/s per connection takes {moving:.0f} ms, so about "
                    f"{waiting:.0%} of it was waiting (the profile's round trip is {profile.rtt_ms:g} ms): the part "
                    "parallel downloads overlap.")
    if where.startswith("lab:"):
        said.append("Lab numbers, not cloud numbers.")
    if repeats < 5:
        said.append(f"Only {repeats} repetition(s): the intervals say little (the course's rule is at least 5).")
    return Conclusion(where, said)


def copies(rows: Any, floor_s: float, where: str, files: int, total_bytes: int) -> Conclusion:
    """``rows``: :func:`dataferry.course.clientdemos.copy_three_ways`'s (``way``, ``seconds``, ``MBps``)."""
    med = rows.groupby("way")["MBps"].median().sort_values(ascending=False)
    said = [f"First read of {files} files ({mb(total_bytes)}): "
            + ", ".join(f"{w} {v:.1f} MB/s" for w, v in med.items()) + " (medians)."]
    if len(med) > 1:
        best, runner = med.index[0], med.index[1]
        r, lo, hi = interval(rows[rows["way"] == best]["MBps"], rows[rows["way"] == runner]["MBps"])
        n = int(rows.groupby("way").size().min())
        said.append(f"{best} against {runner}: " + judged(r, lo, hi, 1.0, f"{best} was the fastest.",
                                                          f"{runner} was the fastest.", n=n))
    whole = rows[rows["way"] == "gcloud storage cp"]["seconds"].median()
    if whole == whole and floor_s == floor_s:  # both measured (not NaN)
        share = floor_s / whole
        said.append(f"The CLI copying one object took {floor_s:.2f} s, {share:.0%} of its {whole:.2f} s for all "
                    f"{files} files: " + ("at this size its MB/s measures mostly the CLI starting, not the transfer; "
                                          "copy more data per call to see its throughput." if share >= STARTUP else
                                          "the transfer, not the start-up, took most of its time." if share <= TRANSFER
                                          else "starting and transferring took about half of it each, so its MB/s "
                                          "understates the transfer; copy more data per call to see its throughput."))
    return Conclusion(where, said)


def faults(run: Any, toxicity: float, cut_after: int, where: str) -> Conclusion:
    """``run``: a :class:`dataferry.course.clientdemos.FaultRun`."""
    stats, report = run.stats, run.report
    said = [f"With {toxicity:.0%} of connections reset immediately and {toxicity:.0%} cut off after {cut_after // 2**10} "
            f"KiB, stage() cached {report.fetched} of {run.objects} objects with {stats.retries} retries and "
            f"{len(report.failures)} failures."]
    ranged = run.served.get(206, 0)
    beyond = run.requests - run.objects - stats.retries
    said.append(f"The server answered {run.requests} media requests for {run.objects} objects: one first try each, "
                f"{stats.retries} retries the cache counted ({ranged} of the requests were ranged, resuming where a "
                "cut-off left off), and "
                + (f"{beyond} most likely re-sent by aiohttp itself, below the cache's count (it re-sends an idempotent "
                   "request once when a kept-alive connection drops before the answer)." if beyond > 0 else
                   f"{-beyond} retries whose connection was reset before the request reached the server."
                   if beyond < 0 else "nothing else."))
    if run.wrong == 0 and run.verified.ok and not report.failures:
        said.append(f"Every cached object equals the stored bytes ({run.objects} compared byte for byte; verify() "
                    f"checked {run.verified.checked} CRC32Cs)" + (": the retries resumed and the checks held."
                                                                  if stats.retries else "."))
    else:
        said.append(f"Not all is well: {run.wrong} objects differ, verify() found {len(run.verified.bad)} bad entries, "
                    f"{len(report.failures)} failed; a failure is reported by name, a bad entry is never served.")
    if stats.retries == 0:
        said.append("No fault hit this run (the toxics pick connections at random): raise FAULT_TOXICITY or N_FILES.")
    return Conclusion(where, said)
