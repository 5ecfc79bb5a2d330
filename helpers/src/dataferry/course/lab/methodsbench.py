"""The method comparisons in the lab: a synthetic target in a lab bucket (:func:`lab_target`); every
method under each region profile in a lab of its own, first and repeated reads (:func:`bench_lab`,
``dataferry bench --lab``) and accelerator utilisation (:func:`bench_au_lab`, ``dataferry bench --au
PROFILE --lab``). Rows are labelled ``lab:<profile>``; nothing here is a cloud number.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dataferry.harness.bench.methods import LAB_METHODS, Target, compare_methods
from dataferry.harness.bench.report import gpu_rows, write_summary
from dataferry.harness.feed import ComputeProfile
from dataferry.course.lab.core import Lab
from dataferry.course.lab.profiles import PROFILES
from dataferry.progress import progress_bar
from dataferry.sources import GCSSource
from dataferry.harness.results import Results
from dataferry.harness.utilisation import AU_METHODS, run_au

__all__ = ["lab_target", "bench_lab", "bench_au_lab"]

MiB = 1 << 20


def lab_target(lab: Lab, bucket: str, n_files: int, file_bytes: int, *, seed: int = 0,
               work: str | os.PathLike[str] | None = None) -> Target:
    """Make a synthetic dataset in a lab bucket (and a plain local copy) and describe it as a
    :class:`~dataferry.harness.bench.Target` for :func:`dataferry.harness.bench.measure`, with gcsfuse mounts when the lab has
    gcsfuse. Without ``work``, the local copy goes to the lab's run folder, which :meth:`Lab.down` removes."""
    work = Path(work) if work else lab.run_dir / "targets" / f"{bucket}-{uuid.uuid4().hex[:8]}"
    ds = lab.make_dataset(bucket, n_files, file_bytes, prefix="m", seed=seed, shard_bytes=None)
    ds.write_to(work / "local")
    client = lab.client()
    mount = (lambda file_cache: lab.mount(bucket, file_cache=file_cache)) if lab.status()["gcsfuse"]["available"] else None
    return Target(names=list(ds.sizes), sizes=dict(ds.sizes), bucket=client.bucket(bucket), prefix="m/files/",
                  local_copy=work / "local" / "m" / "files", source=GCSSource(bucket, "m/files/", client=client),
                  mount=mount)


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
    from dataferry.harness.runtime import capture, detect_region

    out = Path(out)
    with Lab.private() as lab, tempfile.TemporaryDirectory(prefix="dataferry-bench-") as tmp:
        work = Path(tmp)
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
                            "flags": "--implicit-dirs --anonymous-access --custom-endpoint <lab>"
                                     + ("; gcsfuse-cache adds --cache-dir <empty dir>, max-size-mb -1"
                                        if "gcsfuse-cache" in methods else "")},
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
        assert target.local_copy is not None, "a lab target has a local copy"
        batch = (target.local_copy / target.names[0]).read_bytes() * max(1, (64 * MiB) // file_bytes)
        gpu = gpu_rows(results, batch, {"runtime": runtime.kind, "region": "", "region_source": ""}, say)
        result = write_summary(results, out, Path(json_path), say, {"gpu": gpu})
        result["checks"] = _lab_checks(result)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
        say("\nlab checks: " + json.dumps(result["checks"], indent=1, default=str))
        return result


def bench_au_lab(compute: str | ComputeProfile | Sequence[str | ComputeProfile], *,
                 out: str | os.PathLike[str] = "build/bench/au", json_path: str | os.PathLike[str] | None = None,
                 methods: Sequence[str] | None = None, profiles: Sequence[str] = ("same-continent", "cross-continent"),
                 n_files: int = 256, file_bytes: int = 112 << 10, epochs: int = 2, repeats: int = 5,
                 batch_size: int = 32, workers: int = 4, seed: int = 0, say: Callable[[str], None] = print) -> dict:
    """:func:`dataferry.harness.utilisation.bench_au` in a lab of its own: ``n_files`` synthetic files of
    ``file_bytes``, each method under each compute profile and each region ``profiles``."""
    from dataferry.harness.runtime import detect_region

    with Lab.private() as lab, tempfile.TemporaryDirectory(prefix="dataferry-au-") as tmp:
        work = Path(tmp)
        target = lab_target(lab, "bench-au", n_files, file_bytes, seed=seed, work=work)
        regions = [(lab.using_profile(p), detect_region(lab_profile=p)) for p in profiles]
        available = AU_METHODS if target.mount else [m for m in AU_METHODS if not m.startswith("gcsfuse")]
        return run_au(compute, target, regions, methods or available, where="offline lab (not cloud numbers)",
                      out=out, json_path=json_path, epochs=epochs, repeats=repeats, batch_size=batch_size,
                      workers=workers, seed=seed, work=work, say=say)
