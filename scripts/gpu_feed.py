"""The GPU half of "will my GPU starve?", for a machine with an NVIDIA GPU (never needed by the tests).

    python scripts/gpu_feed.py [--out build/bench/gpu.json] [--files 2048] [--workers 8]

1. measures two compute profiles on this GPU (ResNet-50 at 3x224x224, the small CNN at 3x64x64),
2. times pinned vs pageable host-to-device copies of one ResNet-50 batch,
3. trains ResNet-50 for real through ``CachedDataset`` (a local folder of synthetic files as the source,
   DataLoader workers decoding them) and reports AU per epoch (its images at the compute-only rate over
   wall time, as MLPerf Storage counts it), then runs the same
   data path (a fresh cache) into the emulator with the profile just measured, so the emulated AU
   can be checked against the real one.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "helpers" / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "build" / "bench")) + "/gpu.json")
    ap.add_argument("--files", type=int, default=8192)
    ap.add_argument("--file-bytes", type=int, default=110_000, help="about ImageNet's mean JPEG size")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()

    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from dataferry import Cache, CachedDataset, LocalSource
    from dataferry.feed import EmulatedCompute, TorchCompute, feed, image_sample, measure_profile
    from dataferry.timing import time_h2d

    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args),
                 "cpus": os.cpu_count(), "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    resnet = measure_profile("resnet50", batch_size=args.batch, name="resnet50-measured")
    small = measure_profile("smallcnn", batch_size=args.batch, input_shape=(3, 64, 64), name="smallcnn-measured")
    out["profiles"] = {p.name: {"samples_per_s": p.samples_per_s, "batch_size": p.batch_size, "source": p.source}
                       for p in (resnet, small)}
    print(f"{resnet!r}\n{small!r}")
    h2d = time_h2d(bytes(args.batch * 3 * 224 * 224))
    out["h2d"] = {m: sorted(r["bytes"] / r["ns"] * 1e3 for r in h2d if r["method"] == m)
                  for m in ("h2d-pageable", "h2d-pinned")}
    for m, rates in out["h2d"].items():
        print(f"{m}: median {rates[len(rates) // 2]:.0f} MB/s over {len(rates)} copies of {args.batch} images")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "files"
        folder.mkdir()
        for i in range(args.files):
            (folder / f"{i:06d}.bin").write_bytes(os.urandom(args.file_bytes))
        source = LocalSource(folder)
        runs = {}
        for mode, compute in (("cuda", TorchCompute("resnet50")), ("emulated", EmulatedCompute(resnet))):
            if mode == "cuda":
                compute.warm_up((args.batch, 3, 224, 224))
            # Each mode from an empty cache, so both epoch 1s fill it from the folder.
            ds = CachedDataset(source, Cache(Path(tmp) / f"cache-{mode}"), decode=functools.partial(image_sample))
            loader = DataLoader(ds, batch_size=args.batch, num_workers=args.workers, pin_memory=True,
                                sampler=RandomSampler(ds), persistent_workers=True, drop_last=True)
            runs[mode] = feed(loader, compute, epochs=args.epochs)
    out["feed"] = {mode: [r.to_dict() for r in reports] for mode, reports in runs.items()}
    print(f"\nResNet-50 fed through CachedDataset ({args.files} x {args.file_bytes} B, {args.workers} workers, "
          f"batch {args.batch}) on {out['gpu']}:")
    print("| mode | epoch | AU | samples/s | wait p50 ms | wait p95 ms | loader-bound steps |")
    print("|---|---|---|---|---|---|---|")
    for mode, reports in runs.items():
        for r in reports:
            print(f"| {mode} | {r.epoch} | {r.au:.1%} | {r.samples_per_s:.0f} | {r.wait_quantile(0.5) * 1e3:.1f} "
                  f"| {r.wait_quantile(0.95) * 1e3:.1f} | {r.loader_bound}/{r.steps} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
