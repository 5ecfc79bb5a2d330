"""Lesson 05's findings: a byte budget smaller than the data, and a damaged cached copy."""

from __future__ import annotations

from dataferry.cache.counters import CacheStats
from dataferry.course.findings import Conclusion, mb

__all__ = ["budget_and_verify"]


def budget_and_verify(where: str, data_bytes: int, budget: int, peak: int, passes: list[CacheStats],
                      read_refetches: int, read_right: bool, verify_bad: int, verify_checked: int) -> Conclusion:
    """What the run showed of a cache with ``max_bytes=budget`` over ``data_bytes`` of images.

    ``passes``: what the cache counted during pass 1 and pass 2 (every image, the same order) and pass 3
    (only what was still cached). ``read_refetches``/``read_right``: a read of a copy damaged on disk
    downloaded it that many times, with the bucket's bytes or not; ``verify_bad`` of ``verify_checked``:
    what ``verify()`` found after a second copy was damaged."""
    first, second, kept = passes
    said = []
    share = f"{budget / data_bytes:.0%} of the images' bytes" if data_bytes else "of no bytes"
    if peak <= budget:
        said.append(f"A budget of {mb(budget)} ({share}) held: usage peaked at {mb(peak)}.")
    else:
        said.append(f"A budget of {mb(budget)} ({share}) did NOT hold: usage reached {mb(peak)}, a bug to report.")
    reads = second.hits + second.misses
    if second.hits == 0:
        said.append(f"A second pass over the same images had 0 hits in {reads} reads: each image was evicted "
                    "before its turn came again; LRU gives nothing to a scan in a fixed order larger than the budget.")
    else:
        said.append(f"A second pass over the same images had {second.hits} hits in {reads} reads.")
    if kept.misses == 0:
        said.append(f"Re-reading only the {kept.hits} images still cached downloaded none: what the budget keeps "
                    "is read from the disk.")
    else:
        said.append(f"Re-reading the images still cached downloaded {kept.misses} of {kept.hits + kept.misses}.")
    if read_refetches == 1 and read_right:
        said.append("Reading a copy damaged on disk downloaded it again, once, with the bucket's bytes: every "
                    "read checks the copy's CRC32C.")
    else:
        said.append(f"Reading a copy damaged on disk downloaded it {read_refetches} times, "
                    + ("with the bucket's bytes." if read_right else "and did NOT return the bucket's bytes."))
    if verify_bad == 1:
        said.append(f"verify() checked {verify_checked} entries and removed the one copy damaged since it was "
                    "last read.")
    else:
        said.append(f"verify() checked {verify_checked} entries and found {verify_bad} damaged, where one was damaged.")
    images = first.hits + first.misses
    return Conclusion(f"{where}; {images} images, {mb(data_bytes)}", said)
