"""Lesson 10's findings: what a safe save costs against torch.save, and what a failure half-way leaves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataferry.course.findings import Conclusion

__all__ = ["SAME_WITHIN", "saves_and_failures"]

#: Two medians within this factor of each other are "about the same".
SAME_WITHIN = 1.1
STRAIGHT, SAFE = "torch.save", "Checkpoints"


def _compare(place: str, straight: Sequence[float], safe: Sequence[float]) -> str:
    s, c = sorted(straight), sorted(safe)
    ms, mc = s[len(s) // 2], c[len(c) // 2]
    head = f"Into the {place}, torch.save took {ms:.2f} s and Checkpoints {mc:.2f} s (medians, each a new file)"
    if len(s) > 1 and len(c) > 1 and max(s[0], c[0]) <= min(s[-1], c[-1]):
        return (f"{head}: their ranges overlap ({s[0]:.2f}-{s[-1]:.2f} s against {c[0]:.2f}-{c[-1]:.2f} s), so this "
                "run cannot tell them apart.")
    ratio = mc / ms
    if ratio > SAME_WITHIN:
        check = ("checking the CRC32C the bucket computed (nothing is read back)" if "bucket" in place else
                 "reading the copy back to check it")
        return (f"{head}: {ratio:.2f}x, most likely the price of the local write and of {check}, which make a save "
                "a failure cannot tear.")
    if ratio < 1 / SAME_WITHIN:
        return (f"{head}: {ratio:.2f}x, most likely because one local write and a copy in large blocks beat "
                "torch.save's many small writes there.")
    return f"{head}: about the same ({ratio:.2f}x)."


def saves_and_failures(where: str, saves: Any, failures: Sequence[dict[str, Any]], repeats: int) -> Conclusion:
    """``saves``: the rows of ``interleave`` with ``place``, ``way`` (:data:`STRAIGHT` or :data:`SAFE`) and
    ``seconds``; ``failures``: the rows of :func:`dataferry.course.disconnect.stage_failures`."""
    said = []
    for place, rows in saves.groupby("place", sort=False):
        by_way = {way: list(r["seconds"]) for way, r in rows.groupby("way")}
        if STRAIGHT in by_way and SAFE in by_way:
            said.append(_compare(place, by_way[STRAIGHT], by_way[SAFE]))
        elif SAFE in by_way:
            s = sorted(by_way[SAFE])
            said.append(f"Into the {place} through the API, Checkpoints took {s[len(s) // 2]:.2f} s (median).")
    if any(place == "runtime's disk" for place in saves["place"]):
        said.append("The runtime's disk shows the mechanism only: a disconnect deletes it with the runtime.")
    staged = {f["place"] for f in failures if f["failure"].startswith("disconnect")}
    for place in dict.fromkeys(f["place"] for f in failures):
        if place not in staged and place != "runtime's disk":
            said.append(f"A disconnect could not be staged on the {place}: a notebook cannot kill its daemon, so "
                        "only a kernel crash was.")
    for f in failures:
        said.append(f"{f['way']} into the {f['place']}, after a {f['failure']}: a restart finds "
                    f"{f['a restart finds']}.")
    if repeats < 5:
        said.append(f"Only {repeats} save(s) per way: these medians say little (the course's rule is at least 5).")
    return Conclusion(where, said)
