"""First vs repeated reads of the same files by each way of reading them, at equal reader widths.

A :class:`Target` names the files (a bucket prefix, a folder, or both); :func:`compare_methods`
reads them with each method afresh (a new mount, an empty cache or copy folder), pass 1 being a
true first read, and writes one row per file, download, listing and epoch.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataferry.cache import Cache
from dataferry.errors import BadArgument
from dataferry.harness.folders import walk
from dataferry.staging import stage, width_for
from dataferry.harness.results import Results
from dataferry.harness.pagecache import evict
from dataferry.harness.timing import timed_read

__all__ = ["Target", "compare_methods", "check_methods", "LAB_METHODS", "KNOWN_METHODS", "PARALLEL_WORKERS"]

LAB_METHODS = ("local", "gcsfuse", "gcsfuse-serial", "gcsfuse-cache", "api-serial", "api-parallel", "dataferry")
#: How many files at once a parallel method reads (and api-parallel downloads): a DataLoader with workers
#: reads a mount in parallel, so folder methods are read as wide as the API's; "-serial" reads one at a time.
PARALLEL_WORKERS = 16
#: "drive": a folder on a Google Drive mount, whose daemon keeps what it read: its first read cannot be told
#: cold (what Drive keeps is not visible) and its re-reads after a verified eviction are daemon_warm.
FOLDER_METHODS = ("local", "folder", "drive", "gcsfuse", "gcsfuse-cache")
SERIAL = "-serial"
KNOWN_METHODS = (*LAB_METHODS, "folder", "drive", *(m + SERIAL for m in FOLDER_METHODS if m + SERIAL not in LAB_METHODS))


def check_methods(methods: Sequence[str], known: Sequence[str]) -> None:
    """:class:`BadArgument` naming every method of ``methods`` not in ``known``, before anything is measured."""
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise BadArgument(f"unknown method {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")


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
        copy), else cold_verified / cold_unverified from mincore. An eviction that could not be verified
        leaves cold_unverified whatever ``warm_state`` says: the reads may come from RAM."""
        report = evict(list(paths))
        how = f"{report.method}; {report.still_resident} of {report.files} files still resident"
        return (warm_state if warm_state and report.cache_state == "cold_verified" else report.cache_state), how


@contextlib.contextmanager
def method_state(method: str, target: Target, work: Path) -> Iterator[dict[str, Any]]:
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
                import dataferry.gcs_media  # noqa: F401 - its transport's modules, before the clock, as every method's are

                state["cache"] = Cache(state["dir"] / "cache")
            yield state
    finally:
        shutil.rmtree(state["dir"], ignore_errors=True)


def _run_pass(p: _Pass, method: str, st: dict[str, Any], order: list[str], pass_no: int, **common: Any) -> None:
    """One epoch of ``method`` over ``order``: set-up outside the clock (listing, timed as its own
    phase on pass 1; page-cache eviction before a repeat), then everything the method needs to
    get every byte, then the epoch row (sum of bytes / wall time of the whole pass)."""
    run = _folder_pass if method.removesuffix(SERIAL) in FOLDER_METHODS else {
        "api-serial": _api_pass, "api-parallel": _api_pass, "dataferry": _dataferry_pass}[method]
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
    root = {"local": t.local_copy, "folder": t.folder, "drive": t.folder}.get(base) or st["root"] / t.prefix
    paths = {n: root / n for n in order}
    if first:
        _timed_list(p, lambda: walk(root), common)
    kept = "daemon_warm" if base in ("gcsfuse-cache", "drive") and not first else None
    state, how = p.evicted(paths.values(), "cold_unverified" if base == "drive" and first else kept)
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
    check_methods(methods, KNOWN_METHODS)
    if passes < 1 or repeats < 1:
        raise BadArgument("passes and repeats must be >= 1")
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
                with method_state(method, target, work) as st:
                    for pass_no in range(1, passes + 1):
                        _run_pass(p, method, st, order, pass_no, repeat=repeat)
                        if progress is not None:
                            progress.update(1)
            except Exception as e:  # noqa: BLE001 - a failed method is a row, not the end of the run
                p.row(method=method, repeat=repeat, phase="epoch", file=f"({len(order)} files)",
                      error=f"{e.__class__.__name__}: {e}"[:2000], **{"pass": 0})
