"""Ready-made experiments: first vs repeated reads by method and region, at equal reader widths.
Every lab figure is labelled with the profile it ran under (``lab:<profile>``) and the cache state
of each pass; they are not cloud numbers. The cache's own benchmark lives with the lab
(:mod:`dataferry.lab.cachebench`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.cache import Cache
from dataferry.sources import GCSSource
from dataferry.progress import progress_bar
from dataferry.stage import stage, width_for
from dataferry.timing import Results, evict, size_text, timed_read

if TYPE_CHECKING:
    from dataferry.lab import Lab

__all__ = ["compare_methods", "measure", "lab_target", "source_target", "bench_lab", "bench_source", "Target",
           "LAB_METHODS", "summary", "summary_table"]

MiB = 1 << 20


# -- first vs repeated reads, by method and region ------------------------------------------------

LAB_METHODS = ("local", "gcsfuse", "gcsfuse-serial", "gcsfuse-cache", "api-serial", "api-parallel", "dataferry")
#: How many files at once a parallel method reads (and api-parallel downloads): a DataLoader with workers
#: reads a mount in parallel, so folder methods are read as wide as the API's; "-serial" reads one at a time.
PARALLEL_WORKERS = 16
FOLDER_METHODS = ("local", "folder", "gcsfuse", "gcsfuse-cache")
SERIAL = "-serial"


@dataclass
class Target:
    """What a comparison reads: a GCS prefix (bucket, prefix) or a folder, and which files.

    ``mount(file_cache)`` returns a context manager yielding a gcsfuse mount point of the bucket
    (None: gcsfuse methods unavailable). ``local_copy`` is a plain local folder with the same files."""

    names: list[str]
    sizes: dict[str, int]
    bucket: Any = None           # a google-cloud-storage Bucket (API methods)
    prefix: str = ""
    folder: Path | None = None   # a folder holding the files (a Drive or gcsfuse mount)
    local_copy: Path | None = None
    mount: Callable[[bool], Any] | None = None
    source: Any = None           # the dataferry Source over the same files

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes[n] for n in self.names)

    @property
    def mean_file_bytes(self) -> int:
        """The size class of a whole pass's rows: real data sets mix sizes, so one file cannot stand for it."""
        return round(self.total_bytes / len(self.names))


class _Pass:
    """Runs one pass of one method and writes its rows."""

    def __init__(self, results: Results, common: dict[str, Any], target: Target, work: Path) -> None:
        self.results, self.common, self.target, self.work = results, common, target, work

    def row(self, **values: Any) -> None:
        self.results.add(**self.common, **values)

    def read_files(self, paths: dict[str, Path], state: str, eviction: str, width: int = 1, **common: Any) -> None:
        """Read every file whole, ``width`` at a time (threads), one row per file in ``paths`` order."""
        def read(path: Path) -> Any:
            try:
                return timed_read(path)
            except OSError as e:
                return e

        with ThreadPoolExecutor(width) if width > 1 else contextlib.nullcontext() as pool:
            done = pool.map(read, paths.values()) if pool else map(read, paths.values())
            for name, s in zip(paths, done):
                if isinstance(s, OSError):
                    self.row(file=name, file_bytes=self.target.sizes[name], phase="read", cache_state=state,
                             eviction=eviction, concurrency=width, error=f"{s.__class__.__name__}: {s}", **common)
                else:
                    self.row(file=name, file_bytes=self.target.sizes[name], bytes=s.bytes, phase="read",
                             cache_state=state, eviction=eviction, concurrency=width, open_ns=s.open_ns,
                             first_byte_ns=s.first_byte_ns, read_ns=s.read_ns, close_ns=s.close_ns, ns=s.ns,
                             **common)

    def evicted(self, paths: Iterable[Path], warm_state: str | None = None) -> tuple[str, str]:
        """Evict the page cache and say which state the next reads are in, and how eviction went:
        ``warm_state`` where another layer still holds the data (gcsfuse's file cache, a local
        copy), else cold_verified / cold_unverified from mincore."""
        report = evict(list(paths))
        how = f"{report.method}; {report.still_resident} of {report.files} files still resident"
        return (warm_state or report.cache_state), how


def _walk(folder: Path) -> list[str]:
    """Every file under ``folder`` (os.scandir: one syscall per folder, no stat per file)."""
    found, stack = [], [folder]
    while stack:
        with os.scandir(stack.pop()) as it:
            for d in it:
                (stack.append(Path(d.path)) if d.is_dir(follow_symlinks=False) else found.append(d.path))
    return found


@contextlib.contextmanager
def _method_state(method: str, target: Target, work: Path) -> Iterator[dict[str, Any]]:
    """Fresh state for one method's passes: a new mount, an empty cache or copy folder."""
    state: dict[str, Any] = {"dir": Path(tempfile.mkdtemp(prefix=f"{method}-", dir=work))}
    try:
        if method.removesuffix(SERIAL) in ("gcsfuse", "gcsfuse-cache"):
            if target.mount is None:
                raise RuntimeError("gcsfuse methods need a gcsfuse mount, and none is available here")
            with target.mount(method.removesuffix(SERIAL) == "gcsfuse-cache") as mount:
                state["root"] = Path(mount.mountpoint)
                yield state
        else:
            if method == "dataferry":
                state["cache"] = Cache(state["dir"] / "cache")
            yield state
    finally:
        shutil.rmtree(state["dir"], ignore_errors=True)


def _run_pass(p: _Pass, method: str, st: dict[str, Any], order: list[str], pass_no: int, **common: Any) -> None:
    """One epoch of ``method`` over ``order``: set-up outside the clock (listing, timed as its own
    phase on pass 1; page-cache eviction before a repeat), then everything the method needs to
    get every byte, then the epoch row (sum of bytes / wall time of the whole pass)."""
    run = _folder_pass if method.removesuffix(SERIAL) in FOLDER_METHODS else {
        "api-serial": _api_pass, "api-parallel": _api_pass, "dataferry": _dataferry_pass}.get(method)
    if run is None:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(LAB_METHODS)}, folder, and "
                         f"{', '.join(m + SERIAL for m in FOLDER_METHODS)}")
    t = p.target
    common = {"method": method, "pass": pass_no, **common}
    epoch_ns, concurrency, state = run(p, method, st, order, pass_no == 1, common)
    p.row(phase="epoch", file=f"({len(order)} files)", file_bytes=t.mean_file_bytes, bytes=t.total_bytes,
          concurrency=concurrency, ns=epoch_ns, cache_state=state, **common)


def _timed_list(p: _Pass, lister: Callable[[], Any], common: dict[str, Any]) -> Any:
    t0 = time.perf_counter_ns()
    listed = lister()
    p.row(phase="list", file=f"({len(listed)} entries)", ns=time.perf_counter_ns() - t0, bytes=0,
          concurrency=1, cache_state="cold_unverified", **common)
    return listed


def _folder_pass(p: _Pass, method: str, st: dict[str, Any], order: list[str], first: bool,
                 common: dict[str, Any]) -> tuple[int, int, str]:
    t = p.target
    base = method.removesuffix(SERIAL)
    width = 1 if method.endswith(SERIAL) else PARALLEL_WORKERS
    root = {"local": t.local_copy, "folder": t.folder}.get(base) or st["root"] / t.prefix
    paths = {n: root / n for n in order}
    if first:
        _timed_list(p, lambda: _walk(root), common)
    state, how = p.evicted(paths.values(), "daemon_warm" if base == "gcsfuse-cache" and not first else None)
    t0 = time.perf_counter_ns()
    p.read_files(paths, state, how, width, **common)
    return time.perf_counter_ns() - t0, width, state


def _api_pass(p: _Pass, method: str, st: dict[str, Any], order: list[str], first: bool,
              common: dict[str, Any]) -> tuple[int, int, str]:
    t = p.target
    concurrency = PARALLEL_WORKERS if method == "api-parallel" else 1
    if not first:
        state, how = p.evicted(st["copies"].values(), "local_copy")
        t0 = time.perf_counter_ns()
        p.read_files(st["copies"], state, how, concurrency, **common)
        return time.perf_counter_ns() - t0, concurrency, state
    _timed_list(p, lambda: list(t.bucket.list_blobs(prefix=t.prefix or None)), common)
    copies = st["copies"] = {n: st["dir"] / f"{i:06d}.bin" for i, n in enumerate(order)}
    t0 = time.perf_counter_ns()
    if method == "api-serial":  # the 2020 method: one blob after another
        for n in order:
            d0 = time.perf_counter_ns()
            error = ""
            try:
                t.bucket.blob(t.prefix + n).download_to_filename(copies[n])
            except Exception as e:  # noqa: BLE001 - errors are rows
                error = f"{e.__class__.__name__}: {e}"
            p.row(phase="download", file=n, file_bytes=t.sizes[n], bytes=0 if error else t.sizes[n], concurrency=1,
                  ns=time.perf_counter_ns() - d0, cache_state="cold_verified", error=error, **common)
    else:
        from google.cloud.storage import transfer_manager

        outcome = transfer_manager.download_many(
            [(t.bucket.blob(t.prefix + n), str(copies[n])) for n in order], max_workers=concurrency,
            worker_type=transfer_manager.THREAD, raise_exception=False)
        errors = [f"{n}: {r!r}" for n, r in zip(order, outcome) if isinstance(r, Exception)]
        p.row(phase="download", file=f"({len(order)} files)", file_bytes=t.mean_file_bytes, bytes=t.total_bytes,
              concurrency=concurrency, ns=time.perf_counter_ns() - t0, cache_state="cold_verified",
              error="; ".join(errors)[:2000], **common)
    p.read_files(copies, "page_warm", "none: just downloaded", concurrency, **common)
    return time.perf_counter_ns() - t0, concurrency, "cold_verified"


def _dataferry_pass(p: _Pass, method: str, st: dict[str, Any], order: list[str], first: bool,
                    common: dict[str, Any]) -> tuple[int, int, str]:
    t = p.target
    cache: Cache = st["cache"]
    if first:
        st["entries"] = {e.name: e for e in _timed_list(p, lambda: list(t.source.list()), common)}
    entries = st["entries"]
    if first:
        t0 = time.perf_counter_ns()
        report = stage(t.source, cache, [entries[n] for n in order], progress=False)
        p.row(phase="stage", file=f"({report.files} files)", file_bytes=t.mean_file_bytes,
              bytes=report.bytes_fetched, concurrency=width_for(t.source), ns=int(report.seconds * 1e9),
              retries=cache.stats().retries, cache_state="cold_verified",
              error="; ".join(f"{n}: {e}" for n, e in report.failures)[:2000], **common)
        state, how = "page_warm", "none: just staged"
    else:
        state, how = p.evicted((cache.path(t.source, entries[n]) for n in order), "local_copy")
        t0 = time.perf_counter_ns()

    def read(n: str) -> tuple[str, int, Any]:
        r0 = time.perf_counter_ns()
        try:
            return n, len(cache.read(t.source, entries[n])), time.perf_counter_ns() - r0
        except Exception as e:  # noqa: BLE001 - errors are rows
            return n, 0, e

    with ThreadPoolExecutor(PARALLEL_WORKERS) as pool:  # as wide as the other parallel methods read
        for n, size, ns in pool.map(read, order):
            if isinstance(ns, Exception):
                p.row(phase="read", file=n, file_bytes=t.sizes[n], concurrency=PARALLEL_WORKERS, cache_state=state,
                      eviction=how, error=f"{ns.__class__.__name__}: {ns}", **common)
            else:
                p.row(phase="read", file=n, file_bytes=t.sizes[n], bytes=size, concurrency=PARALLEL_WORKERS, ns=ns,
                      cache_state=state, eviction=how, **common)
    return time.perf_counter_ns() - t0, width_for(t.source) if first else PARALLEL_WORKERS, \
        "cold_verified" if first else state


def compare_methods(target: Target, results: Results, methods: Sequence[str], *, region: Any, runtime_kind: str,
                    passes: int = 2, repeats: int = 5, seed: int = 0, work: Path | None = None,
                    progress: Any = None) -> None:
    """Measure each method's first read (pass 1) and repeated reads over ``target``.

    Repetitions interleave the methods in a shuffled order and shuffle the file order, both from
    ``seed``; each repetition starts each method afresh (a new mount, empty cache and folders),
    so pass 1 is a true first read. Every row goes to ``results`` as it is measured; a method
    that fails becomes an error row and the others go on."""
    if passes < 1 or repeats < 1:
        raise ValueError("passes and repeats must be >= 1")
    if work is None:
        with tempfile.TemporaryDirectory(prefix="dataferry-compare-") as tmp:
            return compare_methods(target, results, methods, region=region, runtime_kind=runtime_kind,
                                   passes=passes, repeats=repeats, seed=seed, work=Path(tmp), progress=progress)
    rng = random.Random(seed)
    work = Path(work)
    p = _Pass(results, {"region": region.region, "region_source": region.source, "runtime": runtime_kind}, target, work)
    for repeat in range(1, repeats + 1):
        methods_now, order = list(methods), list(target.names)
        rng.shuffle(methods_now)
        rng.shuffle(order)
        for method in methods_now:
            try:
                with _method_state(method, target, work) as st:
                    for pass_no in range(1, passes + 1):
                        _run_pass(p, method, st, order, pass_no, repeat=repeat)
                        if progress is not None:
                            progress.update(1)
            except Exception as e:  # noqa: BLE001 - a failed method is a row, not the end of the run
                p.row(method=method, repeat=repeat, phase="epoch", file=f"({len(order)} files)",
                      error=f"{e.__class__.__name__}: {e}"[:2000], **{"pass": 0})


def summary(rows: Any) -> dict[str, Any]:
    """Median epoch MB/s per region x method x pass (with bootstrap CIs) and repeat/first ratios."""
    from dataferry.stats import speedup, summarize_frame

    epochs = rows[(rows["phase"] == "epoch") & (rows["pass"] >= 1)].copy()
    epochs["pass"] = epochs["pass"].astype(int)
    ok = epochs[epochs["error"] == ""]
    # File size is an axis (MEASUREMENT.md rule 9): never pool different sizes into one cell.
    cells = summarize_frame(epochs, ["region", "method", "file_bytes", "pass"]).to_dict("records")
    ratios = []
    for (region, method, size), g in ok.groupby(["region", "method", "file_bytes"]):
        first, repeat = g[g["pass"] == 1]["MBps"], g[g["pass"] >= 2]["MBps"]
        if len(first) and len(repeat):
            r, lo, hi = speedup(repeat.to_numpy(float), first.to_numpy(float))
            ratios.append({"region": region, "method": method, "file_bytes": size, "repeat_over_first": r,
                           "ci_low": lo, "ci_high": hi})
    return {"cells": cells, "ratios": ratios}


def summary_table(result: dict[str, Any]) -> str:
    """A markdown table: median MB/s of the first and repeated epochs, and their ratio, per region and method."""
    med = {(c["region"], c["method"], c["file_bytes"], c["pass"]): c for c in result["cells"]}
    ratio = {(r["region"], r["method"], r["file_bytes"]): r for r in result["ratios"]}
    lines = ["| region | method | file size | first read MB/s (n) | repeat MB/s (n) | repeat / first [95% CI] |",
             "|---|---|---|---|---|---|"]
    for key in sorted({(c["region"], c["method"], c["file_bytes"]) for c in result["cells"]}):
        first = med.get((*key, 1))
        repeats = [c for (*k, ps), c in med.items() if tuple(k) == key and ps >= 2]
        r = ratio.get(key)

        def cell(c: dict | None) -> str:
            return f"{c['median']:.1f} ({c['n']})" if c and c["n"] else "-"

        rtxt = f"{r['repeat_over_first']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r else "-"
        size = size_text(key[2]) if key[2] == key[2] else "-"
        lines.append(f"| {key[0]} | {key[1]} | {size} | {cell(first)} | {cell(repeats[0] if repeats else None)} "
                     f"| {rtxt} |")
    return "\n".join(lines)


def _finish(results: Results, out: Path, json_path: Path, say: Callable[[str], None], extra: dict | None = None) -> dict:
    from dataferry.plots import standard_figures
    from dataferry.timing import load_results

    results.close()
    rows = load_results(results.csv_path)
    rows = rows[rows["run_id"] == results.run_id]  # this run only, even in a folder that holds others
    result = {"run_id": results.run_id, "results": str(results.csv_path), **summary(rows), **(extra or {})}
    figures = standard_figures(rows, out / "figures")
    result["figures"] = {k: [str(p) for p in v] for k, v in figures.items()}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, default=str))
    say(summary_table(result))
    say(f"\nrows: {results.csv_path}\nfigures: {out / 'figures'}\nsummary: {json_path}")
    return result


def _bucket_location(target: Target) -> str | None:
    """The bucket's location (region analysis needs both ends), or None for a folder or when not allowed."""
    if target.bucket is None:
        return None
    try:
        target.bucket.reload()
        return target.bucket.location
    except Exception:  # noqa: BLE001 - reading bucket metadata needs a permission many readers lack
        return None


def _gpu_rows(results: Results, batch: bytes, common: dict[str, str], say: Callable[[str], None]) -> str:
    """Time host-to-device copies of a loaded batch where there is CUDA; say so where there is not."""
    from dataferry.timing import time_h2d

    rows = time_h2d(batch)
    if isinstance(rows, str):
        say(rows)
        results.write_meta(gpu=rows)
        return rows
    for row in rows:
        results.add(**common, **row)
    return f"{len(rows)} host-to-device rows"


def _lab_checks(result: dict[str, Any]) -> dict[str, Any]:
    """What the lab comparison is expected to show, as measured values."""
    ratios = {(r["region"], r["method"]): r["repeat_over_first"] for r in result["ratios"]}
    med = {(c["region"], c["method"], c["pass"]): c["median"] for c in result["cells"] if c["n"]}  # one size in the lab
    checks: dict[str, Any] = {}
    for region in sorted({c["region"] for c in result["cells"]}):
        local = med.get((region, "local", 2))
        checks[region] = {
            "gcsfuse_repeat_over_first": ratios.get((region, "gcsfuse")),
            "gcsfuse_cache_repeat_over_local": (med.get((region, "gcsfuse-cache", 2)) or 0) / local if local else None,
            "dataferry_repeat_over_local": (med.get((region, "dataferry", 2)) or 0) / local if local else None,
            "dataferry_repeat_over_first": ratios.get((region, "dataferry")),
        }
    return checks


def bench_lab(out: str | os.PathLike[str] = "build/bench/methods", json_path: str | os.PathLike[str] = "build/bench/methods.json",
              profiles: Sequence[str] = ("colocated", "same-continent", "cross-continent"),
              methods: Sequence[str] = LAB_METHODS, n_files: int = 24, file_bytes: int = 2 * MiB,
              passes: int = 2, repeats: int = 5, seed: int = 0, say: Callable[[str], None] = print) -> dict:
    """The full comparison in a lab of its own: every method, first and repeated reads, under
    each region profile. Rows are labelled ``lab:<profile>``; nothing here is a cloud number."""
    from dataferry.lab import Lab
    from dataferry.lab.profiles import PROFILES
    from dataferry.runtime import capture, detect_region

    out = Path(out)
    lab = Lab(state_dir=tempfile.mkdtemp(prefix="dataferry-bench-state-")).up()
    work = Path(tempfile.mkdtemp(prefix="dataferry-bench-"))
    try:
        if not lab.status()["gcsfuse"]["available"]:
            say(f"gcsfuse unavailable ({lab.status()['gcsfuse']['why']}): its methods become error rows")
        target = lab_target(lab, "bench-methods", n_files, file_bytes, seed=seed, work=work)
        runtime = capture(str(work))
        meta = {"experiment": "methods", "where": "offline lab (not cloud numbers)", "runtime": runtime.to_dict(),
                "seed": seed, "passes": passes, "repeats": repeats, "methods": list(methods),
                "dataset": {"files": n_files, "file_bytes": file_bytes, "total_bytes": target.total_bytes,
                            "over_ram": target.total_bytes / runtime.ram_bytes},
                "bucket_location": "lab (fake-gcs-server; the profile stands for the distance)",
                "profiles": {n: {"rtt_ms": PROFILES[n].rtt_ms, "bandwidth_MBps": PROFILES[n].bandwidth_MBps,
                                 "assumption": PROFILES[n].assumption} for n in profiles},
                "gcsfuse": {"version": lab.status()["gcsfuse"].get("version"),
                            "flags": "--implicit-dirs --anonymous-access --custom-endpoint <lab>; file cache: "
                                     "--cache-dir <empty dir>, max-size-mb -1"},
                "lab_tools": lab.status()["tools"]}
        results = Results(out, meta)
        say(f"comparing {', '.join(methods)} over {n_files} x {file_bytes / MiB:g} MiB, {passes} passes, "
            f"{repeats} repeats, under {', '.join('lab:' + p for p in profiles)}; rows go to {results.csv_path}")
        passes_in_all = len(profiles) * repeats * len(methods) * passes
        with progress_bar(total=passes_in_all, desc="bench --lab", unit="pass") as bar:
            for profile in profiles:
                lab.set_profile(profile)
                bar.set_postfix_str(f"lab:{profile}")
                compare_methods(target, results, methods, region=detect_region(lab_profile=profile),
                                runtime_kind=runtime.kind, passes=passes, repeats=repeats, seed=seed, work=work,
                                progress=bar)
        batch = (target.local_copy / target.names[0]).read_bytes() * max(1, (64 * MiB) // file_bytes)
        gpu = _gpu_rows(results, batch, {"runtime": runtime.kind, "region": "", "region_source": ""}, say)
        result = _finish(results, out, Path(json_path), say, {"gpu": gpu})
        result["checks"] = _lab_checks(result)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
        say("\nlab checks: " + json.dumps(result["checks"], indent=1, default=str))
        return result
    finally:
        lab.down()
        shutil.rmtree(work, ignore_errors=True)


def source_target(uri: str, max_files: int = 200, seed: int = 0,
                  work: str | os.PathLike[str] | None = None, *, client: Any = None, suffix: str = "") -> Target:
    """A :class:`Target` over your own data for :func:`measure`: a seeded sample of at most
    ``max_files`` files of ``gs://bucket/prefix`` (with gcsfuse mounts when gcsfuse is installed)
    or of a folder such as a Drive or gcsfuse mount. ``client`` reads the bucket (default: your
    credentials; an anonymous one reads public buckets, and its mounts are anonymous too);
    ``suffix`` keeps only names that end so (e.g. ``".jpg"``)."""
    from google.auth.credentials import AnonymousCredentials

    from dataferry.mounts import mount_gcsfuse
    from dataferry.sources import LocalSource, from_uri

    source = from_uri(uri, client=client)
    entries = sorted((e for e in source.list() if e.name.endswith(suffix)), key=lambda e: e.name)
    if not entries:
        raise ValueError(f"{uri} holds no files" + (f" ending in {suffix!r}" if suffix else ""))
    chosen = sorted(random.Random(seed).sample(entries, min(max_files, len(entries))), key=lambda e: e.name)
    sizes = {e.name: e.size for e in chosen}
    if isinstance(source, LocalSource):
        return Target(names=list(sizes), sizes=sizes, folder=source.root, source=source)
    work = Path(work or tempfile.mkdtemp(prefix="dataferry-target-"))
    gcs = source._client_here()
    anonymous = isinstance(getattr(gcs, "_credentials", None), AnonymousCredentials)

    def mount(file_cache: bool) -> Any:
        return mount_gcsfuse(source.bucket, anonymous=anonymous,
                             cache_dir=work / f"gcsfuse-cache-{time.monotonic_ns()}" if file_cache else None)

    return Target(names=list(sizes), sizes=sizes, bucket=gcs.bucket(source.bucket), prefix=source.prefix,
                  source=source, mount=mount if shutil.which("gcsfuse") else None)


def bench_source(uri: str, out: str | os.PathLike[str] = "build/bench/source",
                 json_path: str | os.PathLike[str] | None = None, methods: Sequence[str] | None = None,
                 max_files: int = 200, passes: int = 2, repeats: int = 5, seed: int = 0,
                 region: Any = None, say: Callable[[str], None] = print, *, client: Any = None,
                 suffix: str = "", meta: dict[str, Any] | None = None) -> dict:
    """The comparison on your own data: ``gs://bucket/prefix`` (API methods, dataferry, and gcsfuse
    when it is installed) or a folder such as a Drive or gcsfuse mount (the folder itself and
    dataferry). Works unchanged in Colab; rows carry the detected region and runtime (``region``: a
    name, or a :class:`~dataferry.runtime.Region` already found). ``client`` and ``suffix`` go to
    :func:`source_target`; ``meta`` adds to (or corrects) the run's metadata."""
    from dataferry.runtime import Region, capture, detect_region

    out = Path(out)
    work = Path(tempfile.mkdtemp(prefix="dataferry-bench-"))
    target = source_target(uri, max_files=max_files, seed=seed, work=work, client=client, suffix=suffix)
    source, chosen, sizes = target.source, target.names, target.sizes
    default = (["folder", "dataferry"] if target.bucket is None else
               ["api-serial", "api-parallel", "dataferry"] + (["gcsfuse", "gcsfuse-cache"] if target.mount else []))
    methods = list(methods or default)
    where = region if isinstance(region, Region) else detect_region(region)
    runtime = capture(str(work), region=where)
    total = sum(sizes.values())
    meta = {"experiment": "methods", "where": uri, "runtime": runtime.to_dict(), "seed": seed, "passes": passes,
            "repeats": repeats, "methods": methods,
            "bucket_location": (meta or {}).get("bucket_location") or _bucket_location(target),
            "dataset": {"files": len(chosen), "total_bytes": total,
                        "over_ram": total / runtime.ram_bytes if runtime.ram_bytes else None}, **(meta or {})}
    results = Results(out, meta)
    say(f"comparing {', '.join(methods)} over {len(chosen)} files of {uri} ({sum(sizes.values()) / 1e6:.1f} MB), "
        f"region {where}, runtime {runtime.kind}; rows go to {results.csv_path}")
    try:
        with progress_bar(total=repeats * len(methods) * passes, desc="bench", unit="pass") as bar:
            compare_methods(target, results, methods, region=where, runtime_kind=runtime.kind, passes=passes,
                            repeats=repeats, seed=seed, work=work, progress=bar)
        batch = b"".join(Cache(work / "h2d").read(source, name) for name in chosen[:8])
        gpu = _gpu_rows(results, batch, {"runtime": runtime.kind, "region": where.region,
                                         "region_source": where.source}, say)
        return _finish(results, out, Path(json_path or out / "methods.json"), say, {"gpu": gpu})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def lab_target(lab: Lab, bucket: str, n_files: int, file_bytes: int, *, seed: int = 0,
               work: str | os.PathLike[str] | None = None) -> Target:
    """Make a synthetic dataset in a lab bucket (and a plain local copy) and describe it as a
    :class:`Target` for :func:`measure`, with gcsfuse mounts when the lab has gcsfuse."""
    work = Path(work or tempfile.mkdtemp(prefix="dataferry-target-"))
    ds = lab.make_dataset(bucket, n_files, file_bytes, prefix="m", seed=seed, shard_bytes=None)
    ds.write_to(work / "local")
    client = lab.client()
    mount = (lambda file_cache: lab.mount(bucket, file_cache=file_cache)) if lab.status()["gcsfuse"]["available"] else None
    return Target(names=list(ds.sizes), sizes=dict(ds.sizes), bucket=client.bucket(bucket), prefix="m/files/",
                  local_copy=work / "local" / "m" / "files", source=GCSSource(bucket, "m/files/", client=client),
                  mount=mount)


def measure(target: Target, methods: Sequence[str], out: str | os.PathLike[str], *, region: Any = None,
            passes: int = 2, repeats: int = 3, seed: int = 0, meta: dict[str, Any] | None = None):
    """Run :func:`compare_methods` into ``out/results.csv`` and return the rows as a DataFrame.

    The one call a lesson or notebook needs: region defaults to :func:`dataferry.runtime.detect_region`
    (pass the lab's, e.g. ``detect_region(lab_profile=...)``), the runtime is captured once."""
    from dataferry.runtime import capture, detect_region
    from dataferry.timing import load_results

    region = region or detect_region()
    runtime = capture(region=region)
    with Results(out, {"experiment": "methods", "runtime": runtime.to_dict(), "seed": seed, "passes": passes,
                       "repeats": repeats, "methods": list(methods), **(meta or {})}) as results:
        with progress_bar(total=repeats * len(methods) * passes, desc="measuring", unit="pass") as bar:
            compare_methods(target, results, methods, region=region, runtime_kind=runtime.kind, passes=passes,
                            repeats=repeats, seed=seed, progress=bar)
    rows = load_results(results.csv_path)
    return rows[rows["run_id"] == results.run_id].reset_index(drop=True)
