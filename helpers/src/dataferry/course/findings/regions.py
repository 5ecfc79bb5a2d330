"""Lesson 07's findings: what distance to the bucket did to each way of reading, first read and re-read."""

from __future__ import annotations

from typing import Any

from dataferry.course.findings import Conclusion

__all__ = ["COPIES", "SAME", "SHORT_EPOCH_S", "MIN_REPEATS_TO_RANK", "AS_FAST", "NOT_SLOWER", "by_region"]

#: Methods whose re-read reads a copy on local disk.
COPIES = frozenset({"local", "dataferry", "api-serial", "api-parallel", "gcsfuse-cache"})
#: Two re-read medians within this factor are "the same" (local-disk reads vary from run to run).
SAME = 1.5
#: A slowdown below this is "not slower far away".
NOT_SLOWER = 1.1
#: Epochs shorter than this are too short to rank methods by.
SHORT_EPOCH_S = 0.2
#: Fewer repetitions than this per method and region cannot rank methods.
MIN_REPEATS_TO_RANK = 3
#: dataferry's first read at this share of transfer_manager's or more is "as fast".
AS_FAST = 0.95
#: What runtime and bucket being where they are means for the first reads (runtime.colocation's words).
WHERE_MEANS = {
    "same region": "reads stay inside one region, as near as it gets.",
    "inside the bucket's multi-region": "the runtime is in one of the regions that hold the bucket's data.",
    "another region": "every first read crosses regions, and is billed as data transfer.",
    "unknown": "where the runtime or the bucket is could not be found.",
}


def _epochs(rows: Any) -> Any:
    return rows[(rows["phase"] == "epoch") & (rows["error"].fillna("") == "") & (rows["pass"] >= 1)]


def _slowdowns(first: Any, near: str, far: str) -> dict[str, tuple[float, float, float]]:
    """Per method: near/far median first-read MB/s, and the lowest and highest ratio any two repeats give."""
    out = {}
    for method in sorted(set(first["method"])):
        a = first[(first["region"] == near) & (first["method"] == method)]["MBps"]
        b = first[(first["region"] == far) & (first["method"] == method)]["MBps"]
        if len(a) and len(b):
            out[method] = (a.median() / b.median(), a.min() / b.max(), a.max() / b.min())
    return out


def by_region(rows: Any, regions: list[str], *, lab: bool, repeats: int, relation: str | None = None) -> Conclusion:
    """``rows``: a methods run's rows (:func:`dataferry.harness.results.load_results`); ``regions`` nearest first;
    ``relation``: :func:`dataferry.harness.runtime.colocation` of runtime and bucket (None in the lab)."""
    said = []
    failed = rows[(rows["phase"] == "epoch") & (rows["error"].fillna("") != "")]
    for method, g in failed.groupby("method"):
        said.append(f"{method}: {len(g)} failed epoch(s), e.g. {str(g['error'].iloc[0])[:120]}.")
    if lab:
        said.append("The regions are lab profiles: their round trips and bandwidths are inputs we chose, so how much "
                    "slower the far one is, is not a finding; how each way of reading responds is.")
    ep = _epochs(rows)
    first, again = ep[ep["pass"] == 1], ep[ep["pass"] >= 2]
    if len(regions) >= 2:
        near, far = regions[0], regions[-1]
        slow = _slowdowns(first, near, far)
        if slow:
            least, most = min(slow, key=lambda m: slow[m][0]), max(slow, key=lambda m: slow[m][0])
            head = (f"From {near} to {far}, first reads slowed by {slow[least][0]:.1f}x ({least}) to "
                    f"{slow[most][0]:.1f}x ({most})")
            seconds = first[first["region"] == near]["ns"].median() / 1e9
            fewest = first.groupby(["region", "method"]).size().min()
            if least == most:
                said.append(head + ".")
            elif seconds < SHORT_EPOCH_S:
                said.append(head + f", but near first reads lasted a median {seconds * 1e3:.0f} ms per epoch: too short "
                            "to rank the methods by it; raise N_FILES or FILE_BYTES.")
            elif fewest < MIN_REPEATS_TO_RANK:
                said.append(head + f", from {fewest} repetition(s): too few to rank the methods by it.")
            elif slow[least][2] >= slow[most][1]:
                said.append(head + ": their ranges across repeats overlap, so this run cannot rank the methods by it.")
            else:
                said.append(head + f": {most} suffers most from distance here.")
            if slow[least][0] < NOT_SLOWER:
                said.append(f"{least} was not slower far away in this run.")
        med = again.groupby(["region", "method"])["MBps"].median()
        steady = {m: med[(near, m)] / med[(far, m)] for m in sorted(COPIES)
                  if (near, m) in med.index and (far, m) in med.index}
        if steady:
            kept = [m for m, r in steady.items() if 1 / SAME < r < SAME]
            said.append(f"Re-reads of a local copy stayed within {SAME:g}x between {near} and {far} for {len(kept)} of "
                        f"{len(steady)} methods ({', '.join(kept) or 'none'})"
                        + (": once the data is local, the region stops mattering." if len(kept) == len(steady) else "."))
    else:
        said.append("One region only: this run cannot show the effect of distance; lesson 11 pools runs from several.")
    f_med = first.groupby(["region", "method"])["MBps"].median()
    a_med = again.groupby(["region", "method"])["MBps"].median()

    def ratios(a: Any, b: Any, top: str, bottom: str) -> dict[str, float]:
        return {r: a[(r, top)] / b[(r, bottom)] for r in regions if (r, top) in a.index and (r, bottom) in b.index}

    def listed(by_region: dict[str, float]) -> str:
        return ", ".join(f"{r:.2f}x ({region})" for region, r in by_region.items())

    fuse = ratios(a_med, f_med, "gcsfuse", "gcsfuse")
    if fuse:
        said.append(f"gcsfuse without a file cache re-read at {listed(fuse)} its first read"
                    + (": every read crossed the link again." if max(fuse.values()) < SAME else "."))
    staged = ratios(f_med, f_med, "dataferry", "api-parallel")
    short = not first.empty and first["ns"].median() / 1e9 < SHORT_EPOCH_S
    few = not first.empty and first.groupby(["region", "method"]).size().min() < MIN_REPEATS_TO_RANK
    if staged:
        head = f"dataferry's first read ran at {listed(staged)} transfer_manager's (api-parallel)"
        if short or few:
            said.append(head + ": epochs too short or too few to compare them.")
        elif max(staged.values()) < AS_FAST:
            said.append(head + ": slower. The client checks each download's CRC32C either way; what the cache adds "
                        "is copies that survive a crash, one download per machine for every reader, a byte budget, "
                        "and a check on every later read.")
        elif min(staged.values()) >= AS_FAST:
            said.append(head + ": as fast or faster, with copies that survive a crash and a check on every later read.")
        else:
            said.append(head + ": slower in some regions, not in others.")
    if relation is not None:
        said.append(f"Runtime and bucket: {relation}; {WHERE_MEANS.get(relation, '')}".rstrip("; "))
    if repeats < 5:
        said.append(f"Only {repeats} repetition(s): these medians say little (the course's rule is at least 5).")
    where = ", ".join(regions) + f"; medians of {repeats} repetition(s)"
    return Conclusion(where, said)
