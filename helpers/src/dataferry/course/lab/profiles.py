"""Region profiles: how far the lab's "cloud" is from the reader.

A profile is one added round-trip latency and one per-connection bandwidth, applied by toxiproxy
between every client and fake-gcs-server. They are **assumptions**, not measurements; each says
so, and what it stands for. Per-connection is deliberate: a single TCP stream over a long path is
limited by window / RTT, which is why parallel downloads help in the real cloud too.

Figures a lab run produces are labelled ``lab:<profile>`` and are never cloud numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dataferry.course.lab.errors import LabError

__all__ = ["Profile", "PROFILES", "added_rtt_ms", "get_profile", "profile_table"]


@dataclass(frozen=True)
class Profile:
    """Added round-trip latency (ms) and per-connection bandwidth each way (MB/s = 10^6 B/s; None = unlimited)."""

    name: str
    rtt_ms: float
    bandwidth_MBps: float | None
    assumption: str = ""

    @property
    def label(self) -> str:
        """How results measured under this profile are labelled."""
        return f"lab:{self.name}"

    def toxics(self) -> list[dict]:
        """The toxiproxy toxics that make this profile (latency split over both directions)."""
        out: list[dict] = []
        if self.rtt_ms > 0:
            half = self.rtt_ms / 2
            for stream in ("upstream", "downstream"):
                out.append({"name": f"profile_latency_{stream}", "type": "latency", "stream": stream,
                            "toxicity": 1.0, "attributes": {"latency": int(round(half)), "jitter": 0}})
        if self.bandwidth_MBps:
            # toxiproxy's rate is in KB/s with KB = 1000 bytes; uploads (checkpoints) cross the same limit.
            for stream, name in (("downstream", "profile_bandwidth"), ("upstream", "profile_bandwidth_upstream")):
                out.append({"name": name, "type": "bandwidth", "stream": stream,
                            "toxicity": 1.0, "attributes": {"rate": int(round(self.bandwidth_MBps * 1000))}})
        return out

    def __str__(self) -> str:
        bw = f"{self.bandwidth_MBps:g} MB/s per connection" if self.bandwidth_MBps else "unlimited bandwidth"
        return f"{self.name}: +{self.rtt_ms:g} ms round trip, {bw}"


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("unshaped", 0, None, "No shaping: loopback speed. A ceiling, not a region."),
        Profile(
            "colocated", 2, 200,
            "Runtime and bucket in the same region (e.g. us-central1 VM, us-central1 bucket). Assumed, not "
            "measured: 2 ms added round trip, 200 MB/s per download stream. Measure your own round trip with "
            "gcping (https://github.com/GoogleCloudPlatform/gcping) and your own streams with lesson 07.",
        ),
        Profile(
            "same-continent", 30, 50,
            "Bucket in another region of the same continent (e.g. us-central1 <-> us-east1). Assumed, not "
            "measured: 30 ms added round trip, 50 MB/s per stream (one TCP stream carries at most its "
            "window per round trip).",
        ),
        Profile(
            "cross-continent", 120, 20,
            "Bucket on another continent (e.g. us-central1 <-> europe-west4). Assumed, not measured: 120 ms "
            "added round trip, 20 MB/s per stream. The 2020 post found that \"geographic proximity can give a "
            "2x-10x boost to performance\" (https://sharkovsky.github.io/2020/09/18/colab-io-bench.html); "
            "this profile's per-stream bandwidth is a tenth of colocated's, the top of that range.",
        ),
    )
}


def get_profile(profile: str | Profile) -> Profile:
    """Look up a profile by name (a :class:`Profile` passes through)."""
    if isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise LabError(f"unknown region profile {profile!r}; choose one of: {', '.join(PROFILES)}") from None


def added_rtt_ms(region: str) -> float | None:
    """The round trip a lab profile adds, for a region labelled ``lab:<profile>``: how far the lab put the
    bucket. None for a real region, whose distance the result rows do not say."""
    name = region.removeprefix("lab:")
    return PROFILES[name].rtt_ms if region.startswith("lab:") and name in PROFILES else None


def profile_table() -> Any:
    """Every profile as a table row: its label, round trip, bandwidth and the assumption behind it."""
    import pandas as pd

    return pd.DataFrame([{"profile": p.name, "rows are labelled": p.label, "added round trip (ms)": p.rtt_ms,
                          "MB/s per connection, each way": f"{p.bandwidth_MBps:g}" if p.bandwidth_MBps else "unlimited",
                          "assumption": p.assumption} for p in PROFILES.values()])
