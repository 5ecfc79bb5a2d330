"""``python -m benchmarks cache|shards|train``: an option left out is left to the benchmark's own default."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from dataferry.course.cli import MB, Parser, amount, names, path, run, whole

KiB, MiB = 1 << 10, 1 << 20


def _times(unit: int, parse: Callable[[str], float]) -> Callable[[str], int]:
    """An amount in ``unit`` bytes, as bytes."""
    return lambda text: int(parse(text) * unit)


def _bench(name: str) -> Callable[[argparse.Namespace], int]:
    """Run ``benchmarks.<name>.bench_<name>`` with only the options given."""
    def go(args: argparse.Namespace) -> int:
        given = {k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")}
        getattr(importlib.import_module(f"benchmarks.{name}"), f"bench_{name}")(**given)
        return 0
    return go


def build_parser() -> argparse.ArgumentParser:
    from dataferry.course.lab.profiles import PROFILES
    from dataferry.harness.feed import PROFILES as COMPUTE_PROFILES

    parser = Parser(prog="python -m benchmarks", description="dataferry against its peers, in a lab of its own.",
                    argument_default=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true", default=False, help="more log output")
    sub = parser.add_subparsers(dest="command", required=True)
    regions = names(list(PROFILES))

    bc = sub.add_parser("cache", argument_default=argparse.SUPPRESS, help="the cache and its peers: first reads, warm reads, hits (~15 min)")
    bc.add_argument("--out", type=path, help="JSON (default build/bench/cache.json)")
    bc.add_argument("--repeats", type=whole(1, 1000))
    bc.add_argument("--large-mib", dest="large_bytes", type=_times(MiB, whole(1, 2**20)), help="size of the large object")
    bc.add_argument("--peer-repeats", type=whole(1, 1000), help="first epochs per method, data set and profile")
    bc.add_argument("--peer-profiles", type=lambda text: regions(text).split(","), help="lab profiles, comma-separated")
    bc.set_defaults(func=_bench("cache"))

    bs = sub.add_parser("shards", argument_default=argparse.SUPPRESS, help="shards through the cache vs files through it vs webdataset's cache, data "
                                       "larger than the budget (~5 min)")
    bs.add_argument("--out", type=path, help="JSON (default build/bench/shards.json); the figure goes beside it (.png)")
    bs.add_argument("--samples", type=whole(1, 10**7))
    bs.add_argument("--sample-kib", dest="sample_bytes", type=_times(KiB, whole(1, 2**20)))
    bs.add_argument("--shard-mb", dest="shard_bytes", type=_times(MiB, MB))
    bs.add_argument("--budget-share", type=amount(0, 1, low_open=True), help="cache budget over the data set's bytes")
    bs.add_argument("--epochs", type=whole(1, 1000))
    bs.add_argument("--repeats", type=whole(1, 1000), help="runs of every method, each in a fresh process")
    bs.add_argument("--workers", type=whole(0, 1024), help="DataLoader workers, every method alike")
    bs.add_argument("--batch", type=whole(1, 10**6))
    bs.add_argument("--profile", choices=list(PROFILES), help="lab region profile")
    bs.set_defaults(func=_bench("shards"))

    bt = sub.add_parser("train", argument_default=argparse.SUPPRESS, help="where a training epoch's time goes: readers, decoders, workers, the cache cold, "
                                      "warm and with decode-once, and the feed's peers (~12 min)")
    bt.add_argument("--out", type=path, help="JSON (default build/bench/train.json)")
    bt.add_argument("--images", type=whole(5, 10**7), help="flower JPEGs (a fifth per class)")
    bt.add_argument("--batch", type=whole(1, 10**6))
    bt.add_argument("--repeats", type=whole(1, 1000), help="rounds of warm epochs (one per pipeline), and cold-epoch runs")
    bt.add_argument("--plain-files", type=whole(1, 10**7), help="files in the cold-epoch vs plain-read comparison")
    bt.add_argument("--compute", dest="profile", choices=list(COMPUTE_PROFILES),
                    help="the emulated accelerator AU is measured against")
    bt.add_argument("--profile", dest="region", choices=list(PROFILES), help="lab region profile")
    bt.set_defaults(func=_bench("train"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
