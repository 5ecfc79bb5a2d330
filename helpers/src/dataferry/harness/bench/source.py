"""The comparison on your own data (a bucket prefix or a folder), as in Colab: :func:`bench_source`,
or :func:`measure` over any :class:`~dataferry.harness.bench.Target`."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dataferry.harness.bench.methods import Target, compare_methods
from dataferry.harness.bench.report import bucket_location, gpu_rows, write_summary
from dataferry.cache import Cache
from dataferry.progress import progress_bar
from dataferry.harness.results import Results

__all__ = ["source_target", "bench_source", "measure"]


def source_target(uri: str, max_files: int = 200, seed: int = 0, *, client: Any = None, suffix: str = "") -> Target:
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
    gcs = source._client_here()
    anonymous = isinstance(getattr(gcs, "_credentials", None), AnonymousCredentials)

    def mount(file_cache: bool) -> Any:  # a file cache of the mount's own, empty at each mount, gone at unmount
        return mount_gcsfuse(source.bucket, anonymous=anonymous, file_cache=file_cache)

    return Target(names=list(sizes), sizes=sizes, bucket=gcs.bucket(source.bucket), prefix=source.prefix,
                  source=source, mount=mount if shutil.which("gcsfuse") else None)


def bench_source(uri: str, out: str | os.PathLike[str] = "build/bench/source",
                 json_path: str | os.PathLike[str] | None = None, methods: Sequence[str] | None = None,
                 max_files: int = 24, passes: int = 2, repeats: int = 5, seed: int = 0,
                 region: Any = None, say: Callable[[str], None] = print, *, client: Any = None,
                 suffix: str = "", meta: dict[str, Any] | None = None) -> dict:
    """The comparison on your own data: ``gs://bucket/prefix`` (API methods, dataferry, and gcsfuse
    when it is installed) or a folder such as a Drive or gcsfuse mount (the folder itself and
    dataferry). Works unchanged in Colab; rows carry the detected region and runtime (``region``: a
    name, or a :class:`~dataferry.harness.runtime.Region` already found). ``client`` and ``suffix`` go to
    :func:`source_target`; ``meta`` adds to (or corrects) the run's metadata."""
    from dataferry.harness.runtime import Region, capture, detect_region

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="dataferry-bench-") as tmp:
        work = Path(tmp)
        target = source_target(uri, max_files=max_files, seed=seed, client=client, suffix=suffix)
        source, chosen, sizes = target.source, target.names, target.sizes
        default = (["folder", "dataferry"] if target.bucket is None else
                   ["api-serial", "api-parallel", "dataferry"] + (["gcsfuse", "gcsfuse-cache"] if target.mount else []))
        methods = list(methods or default)
        where = region if isinstance(region, Region) else detect_region(region)
        runtime = capture(str(work), region=where)
        total = sum(sizes.values())
        meta = {"experiment": "methods", "where": uri, "runtime": runtime.to_dict(), "seed": seed, "passes": passes,
                "repeats": repeats, "methods": methods,
                "bucket_location": (meta or {}).get("bucket_location") or bucket_location(target),
                "dataset": {"files": len(chosen), "total_bytes": total,
                            "over_ram": total / runtime.ram_bytes if runtime.ram_bytes else None}, **(meta or {})}
        results = Results(out, meta)
        say(f"comparing {', '.join(methods)} over {len(chosen)} files of {uri} ({sum(sizes.values()) / 1e6:.1f} MB), "
            f"region {where}, runtime {runtime.kind}; rows go to {results.csv_path}")
        with progress_bar(total=repeats * len(methods) * passes, desc="bench", unit="pass") as bar:
            compare_methods(target, results, methods, region=where, runtime_kind=runtime.kind, passes=passes,
                            repeats=repeats, seed=seed, work=work, progress=bar)
        batch = b"".join(Cache(work / "h2d").read(source, name) for name in chosen[:8])
        gpu = gpu_rows(results, batch, {"runtime": runtime.kind, "region": where.region,
                                         "region_source": where.source}, say)
        return write_summary(results, out, Path(json_path or out / "methods.json"), say, {"gpu": gpu})


def measure(target: Target, methods: Sequence[str], out: str | os.PathLike[str], *, region: Any = None,
            passes: int = 2, repeats: int = 3, seed: int = 0, meta: dict[str, Any] | None = None):
    """Run :func:`compare_methods` into ``out/results.csv`` and return the rows as a DataFrame.

    The one call a lesson or notebook needs: region defaults to :func:`dataferry.harness.runtime.detect_region`
    (pass the lab's, e.g. ``detect_region(lab_profile=...)``), the runtime is captured once."""
    from dataferry.harness.runtime import capture, detect_region
    from dataferry.harness.results import load_results

    region = region or detect_region()
    runtime = capture(region=region)
    with Results(out, {"experiment": "methods", "runtime": runtime.to_dict(), "seed": seed, "passes": passes,
                       "repeats": repeats, "methods": list(methods), **(meta or {})}) as results:
        with progress_bar(total=repeats * len(methods) * passes, desc="measuring", unit="pass") as bar:
            compare_methods(target, results, methods, region=region, runtime_kind=runtime.kind, passes=passes,
                            repeats=repeats, seed=seed, progress=bar)
    return load_results(results.csv_path, run_id=results.run_id)
