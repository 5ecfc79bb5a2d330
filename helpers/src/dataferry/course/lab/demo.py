"""A one-minute tour of the lab: one object read through the API and through gcsfuse, per profile.

One read of each kind, not a benchmark (``dataferry bench --lab`` is the measurement). It shows
the lab's three parts working together and the effect the course is about: without a file cache
gcsfuse re-reads from the "cloud" at link speed; with one it re-reads from local disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from dataferry.course.lab.core import Lab
from dataferry.course.lab.profiles import PROFILES
from dataferry.harness.pagecache import evict
from dataferry.harness.timing import timed_read

__all__ = ["run_demo"]

OBJECT_BYTES = 20_000_000
BUCKET = "lab-demo"
NAME = "demo/object-20MB.bin"


def _api_rate(client) -> float:
    t0 = time.perf_counter_ns()
    n = len(client.bucket(BUCKET).blob(NAME).download_as_bytes(checksum="crc32c"))
    return n / (time.perf_counter_ns() - t0) * 1e3


def run_demo(lab: Lab, say: Callable[[str], None] = print) -> list[dict]:
    """Read one 20 MB lab object per profile by API and by gcsfuse (without/with file cache)."""
    bucket = lab.create_bucket(BUCKET)
    bucket.blob(NAME).upload_from_string(os.urandom(OBJECT_BYTES))
    gcsfuse = lab.status()["gcsfuse"]
    rows = []
    say(f"One {OBJECT_BYTES / 1e6:.0f} MB object per profile, one read each (a tour, not a benchmark).")
    say("gcsfuse repeat reads come after evicting the page cache (posix_fadvise DONTNEED).\n")
    header = "| region | API first read | gcsfuse first | gcsfuse repeat | gcsfuse+file cache first | gcsfuse+file cache repeat |"
    say(header)
    say("|---" * 6 + "|")
    for name in PROFILES:
        with lab.using_profile(name) as profile:
            client = lab.client()
            api = _api_rate(client)
            row = {"region": profile.label, "api_first_MBps": api}
            if gcsfuse["available"]:
                for cached in (False, True):
                    with lab.mount(BUCKET, file_cache=cached) as m:
                        path = m.mountpoint / NAME
                        first = timed_read(path).MBps
                        evict([path])
                        repeat = timed_read(path).MBps
                    key = "gcsfuse_cache" if cached else "gcsfuse"
                    row[f"{key}_first_MBps"], row[f"{key}_repeat_MBps"] = first, repeat
            rows.append(row)
            cells = [f"{row.get(k, float('nan')):.0f} MB/s" if k in row else "n/a" for k in (
                "api_first_MBps", "gcsfuse_first_MBps", "gcsfuse_repeat_MBps",
                "gcsfuse_cache_first_MBps", "gcsfuse_cache_repeat_MBps")]
            say(f"| {profile.label} ({profile.rtt_ms:g} ms, {profile.bandwidth_MBps or 'no'} MB/s cap) | "
                + " | ".join(cells) + " |")
    if not gcsfuse["available"]:
        say(f"\ngcsfuse columns are n/a: {gcsfuse['why']}")
    lab.delete_bucket(BUCKET)
    return rows
