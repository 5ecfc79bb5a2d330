"""What we run on: region, accelerator, versions and machine facts, captured for result rows.

A benchmark number means little without the place it was taken: a read from a bucket in
``us-central1`` is a different experiment in ``europe-west4``, and a Colab GPU runtime is not
a laptop. :func:`detect_region` finds the cloud region without ever raising or hanging
(override, lab profile, GCE metadata server, an opt-in IP lookup, else ``"unknown"``), and
:func:`capture` records the rest in a :class:`Runtime` that serialises to JSON.

This module imports only :mod:`dataferry.host`. Optional packages (torch, google-cloud-storage,
google-crc32c) are imported lazily inside functions and may be missing.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dataferry.host import in_colab

__all__ = ["METADATA_URL", "REGION_SOURCES", "Region", "detect_region", "in_colab", "memory_tier", "Runtime", "capture", "colocation"]

#: Cloud Storage's multi-regions and predefined dual-regions, with the regions that hold their data
#: (Google's "Bucket locations" page).
MULTI_REGIONS = {"US": ("us-",), "EU": ("europe-",), "ASIA": ("asia-",),
                 "NAM4": ("us-central1", "us-east1"), "EUR4": ("europe-north1", "europe-west4"),
                 "ASIA1": ("asia-northeast1", "asia-northeast2")}

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"

_T = TypeVar("_T")
_JOIN_SLACK_S = 0.2
_MAX_BODY = 64 * 1024
_ZONE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*-[a-z]$")
_VERSION_DISTS = ("torch", "google-cloud-storage", "google-crc32c", "numpy", "pandas", "dataferry")


@dataclass(frozen=True)
class Region:
    """Where the code runs, and how we know: ``source`` says which detection step answered."""

    region: str
    zone: str | None
    source: str

    def __str__(self) -> str:
        where = f"zone {self.zone}, " if self.zone else ""
        return f"{self.region} ({where}from {self.source})"

    def __repr__(self) -> str:
        return f"Region({self.region!r}, {self.zone!r}, {self.source!r})"


def _bounded(fn: Callable[[], _T | None], deadline_s: float) -> _T | None:
    """Run ``fn`` in a daemon thread and give up after ``deadline_s``.

    urllib's timeout covers connect and read but not DNS resolution, which can block for
    many seconds on a host without a resolver for ``metadata.google.internal``; a thread we
    stop waiting for bounds every part. A thread left behind is a daemon and dies with us.
    """
    result: list[_T | None] = [None]

    def target() -> None:
        try:
            result[0] = fn()
        except Exception:
            result[0] = None

    t = threading.Thread(target=target, name="dataferry-region-probe", daemon=True)
    t.start()
    t.join(deadline_s)
    return None if t.is_alive() else result[0]


def _probe_metadata(metadata_url: str, timeout_s: float) -> Region | None:
    """Ask the GCE metadata server for our zone; None unless the answer is trustworthy."""
    req = urllib.request.Request(f"{metadata_url.rstrip('/')}/instance/zone", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout_s) as resp:
        if resp.headers.get("Metadata-Flavor") != "Google":
            return None
        body = resp.read(_MAX_BODY).decode("utf-8", "replace").strip()
    zone = body.rsplit("/", 1)[-1]
    if not _ZONE_RE.match(zone):
        return None
    return Region(zone.rsplit("-", 1)[0], zone, "metadata")


def _probe_ip_lookup(url: str, timeout_s: float) -> Region | None:
    """Ask a geo-IP service (only when the caller named one) for a "region" or "country"."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data = json.loads(resp.read(_MAX_BODY).decode("utf-8", "replace"))
    if not isinstance(data, dict):
        return None
    for key in ("region", "country"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return Region(value.strip(), None, "ip-lookup")
    return None


#: A cloud region's name: ``us-central1``, ``europe-west4``, ``northamerica-northeast2``.
_CLOUD_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")


def colocation(region: str, bucket_location: str) -> str:
    """Where a runtime in ``region`` stands to a bucket in ``bucket_location``: "same region", "inside the
    bucket's multi-region" (or dual-region), "another region", or "unknown" when either is not known."""
    here, there = region.strip().lower(), bucket_location.strip()
    if not _CLOUD_REGION.match(here) or not there or there.lower() == "unknown":
        return "unknown"  # a lab profile, or a geo-IP place ("Iowa, US") rather than a cloud region, says nothing
    if here == there.lower():
        return "same region"
    members = MULTI_REGIONS.get(there.upper())
    if members and any(here == m or (m.endswith("-") and here.startswith(m)) for m in members):
        return "inside the bucket's multi-region"
    return "another region"


def detect_region(
    override: str | None = None,
    *,
    lab_profile: str | None = None,
    metadata_url: str = METADATA_URL,
    ip_lookup_url: str | None = None,
    timeout_s: float = 1.0,
) -> Region:
    """Find the region we run in, trying override, lab profile, metadata server, IP lookup.

    ``override`` falls back to the ``DATAFERRY_REGION`` environment variable. Network steps
    never raise and each is bounded to about ``timeout_s``, so the call returns within about
    ``2 * timeout_s + 0.5`` seconds; when nothing answers the region is ``"unknown"``.
    The third-party IP lookup runs only when ``ip_lookup_url`` is given.
    """
    if override is None:
        override = os.environ.get("DATAFERRY_REGION")
    if override and override.strip():
        return Region(override.strip(), None, "override")
    if lab_profile:
        return Region(f"lab:{lab_profile}", None, "lab")
    deadline = timeout_s + _JOIN_SLACK_S
    found = _bounded(lambda: _probe_metadata(metadata_url, timeout_s), deadline)
    if found is None and ip_lookup_url:
        found = _bounded(lambda: _probe_ip_lookup(ip_lookup_url, timeout_s), deadline)
    return found if found is not None else Region("unknown", None, "unknown")


#: How a region was found, in words (``Region.source`` -> sentence).
REGION_SOURCES = {
    "override": "you named it (REGION, or $DATAFERRY_REGION)",
    "lab": "a lab profile: an assumption, not a real region",
    "metadata": "the GCE metadata server: this runtime is a Google Compute Engine VM",
    "ip-lookup": "a geo-IP lookup of this runtime's public address (coarse: a state or country, not a cloud region)",
    "unknown": "nothing answered: no GCE metadata server, no geo-IP answer (tried in Colab only), no override",
}


@dataclass(repr=False)
class Runtime:
    """A snapshot of the machine and software a measurement ran on."""

    colab: bool
    accelerator: str
    cuda_devices: list[str]
    cpus: int
    ram_bytes: int
    disk_free_bytes: int
    kernel: str
    python: str
    versions: dict[str, str | None] = field(default_factory=dict)
    crc32c_implementation: str | None = None
    gcsfuse: str | None = None
    drop_caches_writable: bool = False
    region: Region = field(default_factory=lambda: Region("unknown", None, "unknown"))
    disk_total_bytes: int = 0

    @property
    def tier(self) -> str | None:
        """In Colab, the memory tier (``standard`` or ``high-RAM``); None elsewhere."""
        return memory_tier(self.ram_bytes) if self.colab else None

    @property
    def kind(self) -> str:
        """Short label for result rows: ``"local-cpu"``, ``"colab-gpu"``, ``"colab-tpu"``..."""
        if self.accelerator.startswith("cuda"):
            cls = "gpu"
        elif self.accelerator.startswith("tpu"):
            cls = "tpu"
        else:
            cls = "cpu"
        return f"{'colab' if self.colab else 'local'}-{cls}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field, plus ``kind``."""
        return {
            "kind": self.kind,
            "colab": self.colab,
            "accelerator": self.accelerator,
            "cuda_devices": list(self.cuda_devices),
            "cpus": self.cpus,
            "ram_bytes": self.ram_bytes,
            "disk_free_bytes": self.disk_free_bytes,
            "disk_total_bytes": self.disk_total_bytes,
            "tier": self.tier,
            "kernel": self.kernel,
            "python": self.python,
            "versions": dict(self.versions),
            "crc32c_implementation": self.crc32c_implementation,
            "gcsfuse": self.gcsfuse,
            "drop_caches_writable": self.drop_caches_writable,
            "region": {"region": self.region.region, "zone": self.region.zone, "source": self.region.source},
        }

    def facts(self) -> list[tuple[str, str]]:
        """(what, value) rows a person reads: where this runs, with what, and how the region was found."""
        if self.accelerator.startswith("cuda"):
            accelerator = "GPU: " + ", ".join(self.cuda_devices)
        elif self.accelerator.startswith("tpu"):
            accelerator = "TPU" + (f" ({self.accelerator.split(':', 1)[1]})" if ":" in self.accelerator else "")
        else:
            accelerator = "none (CPU only)"
        disk = (f"{self.disk_free_bytes / 1e9:.0f} GB free of {self.disk_total_bytes / 1e9:.0f} GB"
                if self.disk_total_bytes else "unknown (the folder asked about was not there)")
        zone = f" (zone {self.region.zone})" if self.region.zone else ""
        return [
            ("Colab", "yes" if self.colab else "no (a local machine, a VM or CI)"),
            ("runtime kind (the label on result rows)", self.kind),
            ("accelerator", accelerator),
            ("region", self.region.region + zone),
            ("region found by", REGION_SOURCES.get(self.region.source, self.region.source)),
            ("CPUs", str(self.cpus)),
            ("RAM", f"{self.ram_bytes / 2**30:.1f} GiB" + (f" (Colab's {self.tier} shape)" if self.tier else "")),
            ("disk", disk),
            ("python", self.python),
            ("gcsfuse", self.gcsfuse or "not on PATH"),
            ("google_crc32c", self.crc32c_implementation or "not installed"),
            ("page cache can be dropped", "globally too (root)" if self.drop_caches_writable else
             "per file only (posix_fadvise)"),
            ("versions", ", ".join(f"{n} {v or '(not installed)'}" for n, v in self.versions.items())),
        ]

    def __repr__(self) -> str:
        return (
            f"Runtime(kind={self.kind!r}, accelerator={self.accelerator!r}, cpus={self.cpus}, "
            f"ram_gib={self.ram_bytes / 2**30:.1f}, python={self.python!r}, region={self.region.region!r})"
        )


def _cuda_devices() -> list[str]:
    """Names of the CUDA devices torch sees; empty without torch or without CUDA."""
    try:
        import torch
    except Exception:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


_TPU_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_NAME", "TPU_WORKER_ID")


def _tpu(dev: str = "/dev") -> str | None:
    """``"tpu"`` or ``"tpu:<type>"`` when a TPU is attached, else None.

    Older TPU hosts expose ``/dev/accel*``; v5e and v6e hosts expose numbered ``/dev/vfio/N``
    groups instead. Colab and Cloud TPU VMs also set TPU variables (the type in
    ``TPU_ACCELERATOR_TYPE``, e.g. ``v5litepod-1``)."""
    kind = os.environ.get("TPU_ACCELERATOR_TYPE", "").strip()
    if kind:
        return f"tpu:{kind}"
    if any(os.environ.get(name) for name in _TPU_ENV_VARS):
        return "tpu"
    if glob.glob(f"{dev}/accel*") or glob.glob(f"{dev}/vfio/[0-9]*"):
        return "tpu"
    return None


def memory_tier(ram_bytes: int) -> str:
    """Colab's runtime shape as far as it shows: ``high-RAM`` from 24 GiB of RAM, else ``standard``."""
    return "high-RAM" if ram_bytes >= 24 * 2**30 else "standard"


def _ram_bytes() -> int:
    """MemTotal from /proc/meminfo, falling back to sysconf; 0 when neither works."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, AttributeError):
        return 0


def _versions() -> dict[str, str | None]:
    """Installed versions of the distributions that shape our measurements (None if absent)."""
    out: dict[str, str | None] = {}
    for dist in _VERSION_DISTS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _crc32c_implementation() -> str | None:
    """google_crc32c's backend ("c" or "python"); the pure-Python one makes checksums slow."""
    try:
        import google_crc32c
    except Exception:
        return None
    impl = getattr(google_crc32c, "implementation", None)
    return str(impl) if impl is not None else None


def _gcsfuse_version(gcsfuse: str | None) -> str | None:
    """First line of ``gcsfuse --version`` for the given binary or the one on PATH."""
    exe = gcsfuse or shutil.which("gcsfuse")
    if not exe:
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for text in (proc.stdout, proc.stderr):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return None


def _disk(path: str) -> tuple[int, int]:
    """(free, total) bytes of the filesystem holding ``path``; zeros when it cannot be read."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return 0, 0
    return int(usage.free), int(usage.total)


def capture(path: str = ".", *, region: Region | None = None, gcsfuse: str | None = None) -> Runtime:
    """Record the runtime: accelerator, CPUs, RAM, free disk at ``path``, versions, region.

    ``region`` None runs :func:`detect_region` with its defaults (bounded, never raises);
    ``gcsfuse`` names a binary to report instead of the one on PATH.
    """
    cuda = _cuda_devices()
    disk_free, disk_total = _disk(path)
    if cuda:
        accelerator = f"cuda:{cuda[0]}"
    elif tpu := _tpu():
        accelerator = tpu
    else:
        accelerator = "cpu"
    return Runtime(
        colab=in_colab(),
        accelerator=accelerator,
        cuda_devices=cuda,
        cpus=os.cpu_count() or 1,
        ram_bytes=_ram_bytes(),
        disk_free_bytes=disk_free,
        disk_total_bytes=disk_total,
        kernel=platform.release(),
        python=platform.python_version(),
        versions=_versions(),
        crc32c_implementation=_crc32c_implementation(),
        gcsfuse=_gcsfuse_version(gcsfuse),
        drop_caches_writable=os.access("/proc/sys/vm/drop_caches", os.W_OK),
        region=region if region is not None else detect_region(),
    )
