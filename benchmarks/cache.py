"""The cache's benchmark, in a lab of its own: what the caching loader promises, measured.

Warm epochs at local-disk speed, a small per-hit overhead, cold small files far faster than
one-by-one downloads, a large object filled faster than one connection carries in bounded
memory, and first epochs at least as fast as the fastest peer a user would pick instead
(:mod:`benchmarks.peers`), on the same objects in the same run. Every figure is a
``lab:<profile>`` number, never a cloud number; ``make bench-cache`` runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dataferry.cache import Cache
from dataferry.course.lab.core import Lab
from benchmarks.peers import DATAFERRY, DISK, PEERS, first_epochs, ratios
from dataferry.course.lab.profiles import PROFILES
from dataferry.sources import GCSSource
from dataferry.staging import BUCKET_IN_FLIGHT, stage
from dataferry.harness.pagecache import evict

__all__ = ["bench_cache"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PEER_DATA = {"small": (2000, 64 * KiB), "large": (8, 64 * MiB)}


def _median_ns(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def _read_files(paths: list[str]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += len(f.read())
    return n


def _fill_in_child(cache_root: Path, bucket: str, name: str, env: dict[str, str]) -> dict:
    """Fill one object into a fresh cache in a child process; return its seconds and peak RSS."""
    code = (
        "import json, re, sys, time\n"
        "from dataferry import Cache, GCSSource\n"
        "src = GCSSource(sys.argv[2]); cache = Cache(sys.argv[1]); e = src.stat(sys.argv[3])\n"
        "t0 = time.perf_counter(); cache.fill(src, e); dt = time.perf_counter() - t0\n"
        # VmHWM, not ru_maxrss: the latter keeps the parent's size from before exec.
        "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
        "print(json.dumps({'seconds': dt, 'bytes': e.size, 'peak_rss_mib': hwm / 1024}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(cache_root), bucket, name], env={**os.environ, **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _raw_get_rate(lab: Lab, bucket: str, name: str) -> float:
    """MB/s of one plain HTTP GET of the object through the lab's proxy: what the link delivers."""
    import requests

    url = f"{lab.endpoint}/download/storage/v1/b/{bucket}/o/{requests.utils.quote(name, safe='')}?alt=media"
    t0 = time.perf_counter()
    n = 0
    with requests.get(url, stream=True, timeout=600) as r:
        r.raise_for_status()
        for chunk in r.iter_content(MiB):
            n += len(chunk)
    return n / (time.perf_counter() - t0) / 1e6


@contextlib.contextmanager
def _lab_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the block (and the processes it starts), then the environment as it was."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_cache(out: str | os.PathLike[str] = "build/bench/cache.json", repeats: int = 5,
                large_bytes: int = GiB, peer_repeats: int = 5,
                peer_profiles: Sequence[str] = ("same-continent", "cross-continent"),
                say: Callable[[str], None] = print) -> dict:
    """Run the cache benchmark in a lab of its own; print a table and write JSON to ``out``."""
    results: dict[str, Any] = {"experiment": "cache", "where": f"lab on {platform.node()}", "repeats": repeats,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with Lab.private() as lab, tempfile.TemporaryDirectory(prefix="dataferry-bench-") as tmp, \
            _lab_environment(lab.env()):
        work = Path(tmp)
        results.update(_warm_and_hits(lab, work, repeats, say))
        results.update(_cold_small(lab, work, say))
        results.update(_cold_large(lab, work, large_bytes, say))
        results.update(_against_peers(lab, work, peer_repeats, peer_profiles, say))
    results["goals"] = {"warm_vs_local": ">= 0.90", "cold_small_vs_serial": ">= 10",
                        "cold_large_vs_link": ">= 0.90", "cold_large_peak_rss_mib": "< 256", "hit_overhead": "<= 1.5",
                        "first_vs_best_peer_small": ">= 1.2", "first_vs_best_peer_large": ">= 1.2",
                        "first_vs_limit_small": "(the machine's limit)", "first_vs_limit_large": "(the machine's limit)",
                        "large_object_vs_link": "> 1.5"}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))
    say("")
    say("| key | value | goal | conditions |")
    say("|---|---|---|---|")
    for key, cond in (("warm_vs_local", results["warm_conditions"]), ("hit_overhead", results["hit_conditions"]),
                      ("cold_small_vs_serial", results["cold_small_conditions"]),
                      ("cold_large_vs_link", results["cold_large_conditions"]),
                      ("large_object_vs_link", results["cold_large_conditions"]),
                      ("cold_large_peak_rss_mib", "peak RSS of the filling process"),
                      ("first_vs_best_peer_small", results["peers_conditions"]["small"]),
                      ("first_vs_best_peer_large", results["peers_conditions"]["large"]),
                      ("first_vs_limit_small", results["limit_conditions"]["small"]),
                      ("first_vs_limit_large", results["limit_conditions"]["large"])):
        say(f"| {key} | {results[key]:.2f} | {results['goals'][key]} | {cond} |")
    say(f"\nwrote {out}")
    return results


def _warm_and_hits(lab: Lab, work: Path, repeats: int, say: Callable[[str], None]) -> dict:
    n, size = 1000, 256 * KiB
    say(f"warm epoch: {n} x {size // KiB} KiB through the cache vs the same files in a plain folder, "
        f"page cache dropped before each pass, {repeats} passes each, interleaved")
    ds = lab.make_dataset("bench-warm", n, size, prefix="w", seed=1, shard_bytes=None)
    source = GCSSource("bench-warm", "w/files/")
    cache = Cache(work / "cache-warm")
    stage(source, cache, progress=False)
    entries = sorted(source.list(), key=lambda e: e.name)
    plain = work / "plain"
    ds.write_to(plain)
    plain_paths = [str(plain / name) for name in ds.object_names]
    cached_paths = [str(cache.path(source, e)) for e in entries]
    local_s, cache_s, states = [], [], set()
    for _ in range(repeats):
        states.add(evict(plain_paths).cache_state)
        t0 = time.perf_counter()
        _read_files(plain_paths)
        local_s.append(time.perf_counter() - t0)
        states.add(evict(cached_paths).cache_state)
        t0 = time.perf_counter()
        for e in entries:
            cache.read(source, e)
        cache_s.append(time.perf_counter() - t0)
    total = n * size
    local_rate, cache_rate = total / statistics.median(local_s) / 1e6, total / statistics.median(cache_s) / 1e6
    say(f"  plain folder {local_rate:.0f} MB/s, through the cache {cache_rate:.0f} MB/s (medians; {sorted(states)})")

    say("hit overhead: open+read of one cached 64 KiB file, through the cache vs plain, pages in memory")
    small = lab.make_dataset("bench-hit", 1, 64 * KiB, prefix="h", seed=2, shard_bytes=None)
    hsource = GCSSource("bench-hit", "h/files/")
    entry = next(iter(hsource.list()))
    path = str(cache.path(hsource, entry))
    assert cache.read(hsource, entry) == small.content(entry.name)
    reps = 20_000
    plain_ns, cache_ns = [], []
    for _ in range(repeats):  # interleaved blocks, so drift hits both
        plain_ns.append(_median_ns(lambda: _read_files([path]), reps // repeats))
        cache_ns.append(_median_ns(lambda: cache.read(hsource, entry), reps // repeats))
    p, c = statistics.median(plain_ns), statistics.median(cache_ns)
    say(f"  plain {p / 1000:.1f} us, through the cache {c / 1000:.1f} us (median per call)")
    return {
        "warm_vs_local": cache_rate / local_rate, "warm_local_MBps": local_rate, "warm_cache_MBps": cache_rate,
        "warm_cache_states": sorted(states), "warm_local_s": local_s, "warm_cache_s": cache_s,
        "warm_conditions": f"{n} x {size // KiB} KiB, page cache dropped ({', '.join(sorted(states))}), "
                           f"median of {repeats}",
        "hit_overhead": c / p, "hit_plain_ns": p, "hit_cache_ns": c,
        "hit_conditions": f"64 KiB, page_warm, median of {reps} calls",
    }


def _cold_small(lab: Lab, work: Path, say: Callable[[str], None]) -> dict:
    n, size, profile = 2000, 64 * KiB, PROFILES["same-continent"]
    say(f"cold small files: {n} x 64 KiB under {profile.label}: stage({BUCKET_IN_FLIGHT} in flight) "
        "vs one-by-one blob.download_to_filename (the 2020 method)")
    lab.make_dataset("bench-small", n, size, prefix="s", seed=3, shard_bytes=None)
    source = GCSSource("bench-small", "s/files/")
    entries = list(source.list())
    with lab.using_profile(profile):
        report = stage(source, Cache(work / "cache-small"), entries, progress=False)
        staged_s = report.seconds
        bucket = lab.client().bucket("bench-small")
        target = work / "serial"
        target.mkdir()
        t0 = time.perf_counter()
        for i, e in enumerate(entries):
            bucket.blob("s/files/" + e.name).download_to_filename(target / f"{i}.bin")
        serial_s = time.perf_counter() - t0
    say(f"  stage {staged_s:.1f} s, serial {serial_s:.1f} s")
    return {"cold_small_vs_serial": serial_s / staged_s, "cold_small_stage_s": staged_s,
            "cold_small_serial_s": serial_s, "cold_small_failures": len(report.failures),
            "cold_small_conditions": f"{n} x 64 KiB, {profile.label} ({profile}), fresh cache and folder, n=1 each"}


def _cold_large(lab: Lab, work: Path, size: int, say: Callable[[str], None]) -> dict:
    profile = PROFILES["same-continent"]
    say(f"cold large object: one {size / GiB:g} GiB object under {profile.label}, filled by a fresh process")
    blob = lab.create_bucket("bench-large").blob("big.bin")
    data_file = work / "big.bin"
    with open(data_file, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    blob.upload_from_filename(data_file)
    data_file.unlink()
    with lab.using_profile(profile):
        link = _raw_get_rate(lab, "bench-large", "big.bin")
        filled = _fill_in_child(work / "cache-large", "bench-large", "big.bin", lab.env())
    rate = filled["bytes"] / filled["seconds"] / 1e6
    say(f"  cache fill {rate:.1f} MB/s, plain GET {link:.1f} MB/s, nominal {profile.bandwidth_MBps:g} MB/s, "
        f"peak RSS {filled['peak_rss_mib']:.0f} MiB")
    return {"cold_large_vs_link": rate / link, "large_object_vs_link": rate / link,
            "cold_large_MBps": rate, "cold_large_link_MBps": link,
            "cold_large_nominal_MBps": profile.bandwidth_MBps, "cold_large_vs_nominal": rate / profile.bandwidth_MBps,
            "cold_large_peak_rss_mib": filled["peak_rss_mib"],
            "cold_large_conditions": f"{size / GiB:g} GiB, {profile.label}; link = one plain streaming GET "
                                     f"through the same proxy ({link:.1f} MB/s; nominal {profile.bandwidth_MBps:g})"}


def _against_peers(lab: Lab, work: Path, repeats: int, profiles: Sequence[str], say: Callable[[str], None]) -> dict:
    """First epochs of dataferry, its peers and this disk's durable write on the same objects, per data set and
    profile; dataferry's ratio to the fastest peer and to the slower of that peer and the disk (each the median of
    the repetitions' ratios, :func:`~benchmarks.peers.ratios`)."""
    out: dict[str, Any] = {"peers": {}, "peers_conditions": {}, "limit_conditions": {}}
    for which, (n, size) in PEER_DATA.items():
        bucket = f"peers-{which}"
        lab.make_dataset(bucket, n, size, prefix="p", seed=7, shard_bytes=None)
        worst = worst_of_limit = None
        for name in profiles:
            profile = PROFILES[name]
            say(f"first epoch vs peers: {n} x {size // KiB:,} KiB under {profile.label}, each method cold in a "
                f"fresh process, median of {repeats} interleaved")
            with lab.using_profile(profile):
                runs = first_epochs(lab, bucket, "p/files/", work / "peers", (*PEERS, *DATAFERRY, DISK), repeats,
                                    seed=11, say=say)
            summary = ratios(runs)
            out["peers"][f"{which}/{profile.label}"] = summary
            ratio = min(summary[f"{m}_vs_best_peer"] for m in DATAFERRY)
            worst = ratio if worst is None else min(worst, ratio)
            of_limit = min(summary[f"{m}_vs_limit"] for m in DATAFERRY)
            worst_of_limit = of_limit if worst_of_limit is None else min(worst_of_limit, of_limit)
            say(f"  best peer {summary['best_peer']}: " + ", ".join(
                f"{m} x{summary[f'{m}_vs_best_peer']:.2f} ({min(summary[f'{m}_vs_best_peer_rounds']):.2f}-"
                f"{max(summary[f'{m}_vs_best_peer_rounds']):.2f} by repetition)" for m in DATAFERRY))
            disk = summary["methods"][DISK]["median_MBps"]
            say(f"  this disk writes the same bytes, makes them durable and reads them back at {disk:.1f} MB/s; over "
                f"the slower of that and the best peer: " + ", ".join(
                    f"{m} x{summary[f'{m}_vs_limit']:.2f} ({min(summary[f'{m}_vs_limit_rounds']):.2f}-"
                    f"{max(summary[f'{m}_vs_limit_rounds']):.2f})" for m in DATAFERRY))
            busy = [row["machine_busy"] for row in summary["methods"].values()]
            say("  CPU s of each method's process: " + ", ".join(
                f"{m} {row['median_cpu_s']:.2f}" for m, row in summary["methods"].items())
                + f"; the machine was {min(busy):.0%}-{max(busy):.0%} busy on its {os.cpu_count()} cores")
        out[f"first_vs_best_peer_{which}"] = worst
        out[f"first_vs_limit_{which}"] = worst_of_limit
        out["peers_conditions"][which] = (f"{n} x {size // KiB:,} KiB, {', '.join(PROFILES[p].label for p in profiles)}; "
                                          f"the lower of stage and first-read over the fastest of {', '.join(PEERS)}, "
                                          f"worst profile, the median of {repeats} repetitions' ratios")
        out["limit_conditions"][which] = (f"{n} x {size // KiB:,} KiB, {', '.join(PROFILES[p].label for p in profiles)}; "
                                          f"the lower of stage and first-read over the slower of the fastest peer and "
                                          f"{DISK} (this disk writing the same bytes, durably, and reading them back), "
                                          f"worst profile, the median of {repeats} repetitions' ratios")
    return out
