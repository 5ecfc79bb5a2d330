"""The GPU half of "will my GPU starve?", for a machine with an NVIDIA GPU (never needed by the tests).

    python scripts/gpu_feed.py [--out build/bench/gpu.json] [--images 5120] [--workers 14]

1. measures two compute profiles on this GPU (ResNet-50 at 3x224x224, the small CNN at 3x64x64) and
   times pinned vs pageable host-to-device copies of one ResNet-50 batch;
2. trains ResNet-50 for real on the lab's flower JPEGs (real labels, five classes, a local folder as the
   source): torchvision's ``ImageFolder`` on that folder, then ``compare_decoders`` through the cache
   (PIL, PIL's draft mode, torchvision's CPU decoder, the GPU decoding each batch, decode-once, decode-once's
   pixels cropped on the GPU), AU
   counted as MLPerf Storage counts it (the images at the compute-only rate over wall time); then the
   PIL loop once more into the emulator with the profile just measured, to check its AU against the real one;
   then PIL, the GPU decoding, decode-once and decode-once cropped on the GPU with as few workers as a Colab
   runtime has vCPUs;
3. times epoch 1 through the cache from a folder against plain reads of it, bytes only, at several
   DataLoader worker counts.
Prints tables and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "helpers" / "src"), str(ROOT)]  # the package, and benchmarks/ beside it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "build" / "bench")) + "/gpu.json")
    ap.add_argument("--images", type=int, default=5120)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--epochs", type=int, default=4, help="per reader; the first starts the workers")
    ap.add_argument("--few-workers", type=int, default=2, help="as many as a Colab runtime has vCPUs")
    ap.add_argument("--cold-files", type=int, default=6000)
    ap.add_argument("--cold-widths", default="1,4,14", help='"" skips the cold-epoch comparison')
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision.datasets import ImageFolder

    from dataferry import LocalSource
    from dataferry.harness.bench.decoders import augment, compare_decoders, decoder_gains
    from dataferry.harness.feed import EmulatedCompute, TorchCompute, feed, measure_profile
    from dataferry.course.lab.flowers import plan_flowers
    from benchmarks.train import cold_epoch_vs_plain_read
    from dataferry.harness.timing import time_h2d

    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args),
                 "cpus": os.cpu_count(), "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    resnet = measure_profile("resnet50", batch_size=args.batch, name="resnet50-measured")
    small = measure_profile("smallcnn", batch_size=args.batch, input_shape=(3, 64, 64), name="smallcnn-measured")
    out["profiles"] = {p.name: {"samples_per_s": p.samples_per_s, "batch_size": p.batch_size, "source": p.source}
                       for p in (resnet, small)}
    print(f"{resnet!r}\n{small!r}", flush=True)
    h2d = time_h2d(bytes(args.batch * 3 * 224 * 224))
    out["h2d"] = {m: sorted(r["bytes"] / r["ns"] * 1e3 for r in h2d if r["method"] == m)
                  for m in ("h2d-pageable", "h2d-pinned")}
    for m, rates in out["h2d"].items():
        print(f"{m}: median {rates[len(rates) // 2]:.0f} MB/s over {len(rates)} copies of {args.batch} images")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        flowers = plan_flowers(args.images // 5, seed=23, prefix="flowers/").write_to(work / "photos")
        folder = work / "photos" / "flowers"
        sizes = [p.stat().st_size for p in folder.rglob("*.jpg")]
        out["images"] = {"count": len(sizes), "median_bytes": statistics.median(sizes), "seconds_to_draw": time.perf_counter() - t0}
        print(f"{len(sizes)} flower JPEGs, median {statistics.median(sizes) / 1e3:.0f} KB, "
              f"drawn in {time.perf_counter() - t0:.0f} s", flush=True)

        real = TorchCompute("resnet50")
        real.warm_up((args.batch, 3, 224, 224))
        print(f"{real!r}", flush=True)
        rows = []
        ds = ImageFolder(folder, transform=augment())
        loader = DataLoader(ds, batch_size=args.batch, sampler=RandomSampler(ds), num_workers=args.workers,
                            pin_memory=True, persistent_workers=True)
        for r in feed(loader, real, epochs=args.epochs):
            rows.append({"decoder": "imagefolder-local", "workers": args.workers, "epoch": r.epoch, "samples_per_s": r.samples_per_s, "au": r.au,
                         "wait_share": r.wait_s / r.wall_s, "compute": "real"})
            print(f"  imagefolder-local      epoch {r.epoch}: {r.samples_per_s:6.0f} samples/s, AU {r.au:4.0%}", flush=True)
        del loader
        source = LocalSource(folder)
        for row in compare_decoders(source, work / "real", real, workers=args.workers, batch_size=args.batch,
                                    epochs=args.epochs, say=lambda s: print(s, flush=True)):
            rows.append({**row, "compute": "real"})
        for row in compare_decoders(source, work / "emulated", EmulatedCompute(resnet), workers=args.workers,
                                    batch_size=args.batch, epochs=args.epochs, decoders=["pil"], decode_once=None,
                                    say=lambda s: print(s, flush=True)):
            rows.append({**row, "compute": "emulated"})
        for row in compare_decoders(source, work / "few", real, workers=args.few_workers, batch_size=args.batch,
                                    epochs=args.epochs, decoders=["pil", "gpu"],
                                    say=lambda s: print(s, flush=True)):
            rows.append({**row, "decoder": f"{row['decoder']}, {args.few_workers} workers", "compute": "real"})
        out["rows"] = rows
        out["gains_over_pil"] = decoder_gains([r for r in rows if r["compute"] == "real" and r["workers"] == args.workers])

        cold = []
        blobs = [data for _, data in flowers.objects()]
        for width in (int(w) for w in args.cold_widths.split(",") if w):
            plain, cached, written = cold_epoch_vs_plain_read(blobs, work / f"cold-{width}", width,
                                                              EmulatedCompute(resnet), files=args.cold_files,
                                                              repeats=args.repeats, batch=64,
                                                              say=lambda s: print(s, flush=True))
            cold.append({"workers": width, "plain_files_per_s": plain, "cold_files_per_s": cached,
                         "copies_written_files_per_s": written})
        out["cold_epoch"] = cold

    print(f"\nResNet-50 trained on {len(sizes)} flower JPEGs ({args.workers} workers, batch {args.batch}, "
          f"{os.cpu_count()} CPUs) on {out['gpu']}; compute-only {real.samples_per_s:,.0f} img/s:")
    print("| reader / decoder | compute | later epochs img/s (median) | AU | waiting | ms/img (1 core; gpu: on the GPU) |")
    print("|---|---|---|---|---|---|")
    seen: dict = {}
    for r in rows:
        if r["epoch"] > 1:
            seen.setdefault((r["decoder"], r["compute"]), []).append(r)
    for (decoder, compute), rs in seen.items():
        ms = rs[0].get("decode_ms_per_sample")
        print(f"| {decoder} | {compute} | {statistics.median(r['samples_per_s'] for r in rs):,.0f} | "
              f"{statistics.median(r['au'] for r in rs):.0%} | {statistics.median(r['wait_share'] for r in rs):.0%} | "
              f"{'' if ms is None else f'{ms:.2f}'} |")
    print("gains over PIL (ratio, 95% interval):", {k: tuple(round(x, 2) for x in v) for k, v in out["gains_over_pil"].items()})
    print("\n| workers | plain read files/s | cache epoch 1 files/s | ratio |")
    print("|---|---|---|---|")
    for c in cold:
        p, q = statistics.median(c["plain_files_per_s"]), statistics.median(c["cold_files_per_s"])
        print(f"| {c['workers']} | {p:,.0f} | {q:,.0f} | {q / p:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
