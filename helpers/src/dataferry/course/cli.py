"""The ``dataferry`` command. Only this module parses argv.

    dataferry stage SOURCE --cache DIR               stage gs://bucket/prefix or a folder into a cache
    dataferry cache inspect|verify|prune|clear DIR   look after a cache folder
    dataferry shards make SOURCE DEST [--shard-mb N] pack files into tar shards with an index
    dataferry bench SOURCE | --lab                   first vs repeated reads by method (CSV, figures, JSON)
    dataferry bench --au PROFILE SOURCE | --lab      will the GPU starve: utilisation by method and epoch
    dataferry report RESULTS...                      pool result files, redraw the figures

    dataferry lab up [--profile NAME] [--port N]     start the offline lab (builds tools once)
    dataferry lab status [--json]                    what runs, where, under which profile
    dataferry lab profile [NAME]                     list profiles, or switch to NAME
    dataferry lab mount BUCKET [--file-cache]        mount a lab bucket with gcsfuse
    dataferry lab dataset BUCKET --files N --size B  upload a synthetic dataset
    dataferry lab demo                               a one-minute tour (starts and stops a lab)
    dataferry lab down                               stop everything, leave nothing behind
    dataferry lab build                              build the lab's tools now
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from dataferry import __version__

__all__ = ["main", "run"]


class Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line (``dataferry: error: ...``) and exit status 2, as the command's own."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"dataferry: error: {self.prog.removeprefix('dataferry').strip() or 'dataferry'}: {message} "
                     f"(see `{self.prog} --help`)\n")


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argument that is a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {low} to {high}" if high is not None
                                             else f"{value} is out of range: give {low} or more")
        return value
    return parse


def amount(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argument that is a finite number from ``low`` (excluded if ``low_open``) to ``high``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a number {'above' if low_open else 'from'} "
                                             f"{low:g} {'and up ' if low_open else ''}to {high:g}")
        return value
    return parse


def path(text: str) -> str:
    """A path or address that is not empty (an empty one would mean the current folder)."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a path: give a folder, a file or gs://bucket/prefix")
    return text


def names(choices: Sequence[str]) -> Callable[[str], str]:
    """A comma-separated list of names, each one of ``choices``."""
    def parse(text: str) -> str:
        names = [n.strip() for n in text.split(",")]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown))}: choose from {', '.join(choices)}")
        return text
    return parse


_COUNT = whole(1, 10**9)
MB = amount(0, 1e6, low_open=True)  # a shard of up to a terabyte


def _lab(args: argparse.Namespace):
    from dataferry.course.lab import Lab

    return Lab(state_dir=args.state_dir)


def _compute_profiles(text: str) -> list[str]:
    """``--au``'s value: comma-separated names of :data:`dataferry.harness.feed.PROFILES`."""
    from dataferry.harness.feed import PROFILES

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown compute profile {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(sorted(PROFILES))}")
    return names


def _print_status(status: dict) -> None:
    if not status["up"] and "endpoint" not in status:
        print(f"lab: down (state in {status['state_dir']})")
        return
    print(f"lab: {'up' if status['up'] else 'NOT HEALTHY (run `dataferry lab up` to restart it)'}")
    print(f"  endpoint        {status['endpoint']}   (STORAGE_EMULATOR_HOST; gcsfuse --custom-endpoint "
          f"{status['endpoint']}/storage/v1/)")
    print(f"  direct          {status['direct_endpoint']}   (fake-gcs-server itself, unshaped)")
    print(f"  toxiproxy API   {status['toxiproxy_api']}")
    p = status["profile"] or {}
    bw = f"{p.get('bandwidth_MBps')} MB/s per connection" if p.get("bandwidth_MBps") else "unlimited"
    print(f"  profile         lab:{p.get('name')} (+{p.get('rtt_ms')} ms round trip, {bw})")
    for name, proc in status["processes"].items():
        print(f"  {name:<15} pid {proc['pid']} {'alive' if proc['alive'] else 'DEAD'} "
              f"({status['tools'].get(name, '')})")
    g = status["gcsfuse"]
    print(f"  gcsfuse         {g['version'] + ' ' + g['path'] if g['available'] else 'unavailable: ' + g['why']}")
    for point, m in status["mounts"].items():
        cache = "with file cache" if m["file_cache"] else "no file cache"
        print(f"  mount           gs://{m['bucket']} at {point} ({cache}, pid {m['pid']})")
    print(f"  run folder      {status['run_dir']}")


def cmd_lab(args: argparse.Namespace) -> int:
    from dataferry.course.lab import PROFILES, TOOLS, ensure_tool
    from dataferry.course.lab.datasets import LogNormal

    lab = _lab(args)
    if args.lab_command == "up":
        lab.up(profile=args.profile, port=args.port)
        _print_status(lab.status())
        print(f"\nexport STORAGE_EMULATOR_HOST={lab.endpoint}")
    elif args.lab_command == "status":
        status = lab.status()
        print(json.dumps(status, indent=1)) if args.json else _print_status(status)
        return 0 if status["up"] else 3
    elif args.lab_command == "down":
        done = lab.down()
        print("\n".join(done) if done else "lab: nothing was running")
    elif args.lab_command == "profile":
        if args.name is None:
            current = lab.profile.name if lab.running else None
            for name, p in PROFILES.items():
                print(f"{'*' if name == current else ' '} {p}")
                if p.assumption:
                    print(f"      {p.assumption}")
        else:
            print(f"profile now {lab.set_profile(args.name)}")
    elif args.lab_command == "mount":
        m = lab.mount(args.bucket, file_cache=args.file_cache, mountpoint=args.at)
        print(m.mountpoint)
        print(f"# unmount with: dataferry lab unmount {m.mountpoint} (or dataferry lab down)", file=sys.stderr)
    elif args.lab_command == "unmount":
        lab.unmount(args.mountpoint)
    elif args.lab_command == "dataset":
        size = LogNormal(args.size, args.sigma) if args.sigma else args.size
        ds = lab.make_dataset(args.bucket, args.files, size, prefix=args.prefix, seed=args.seed,
                              shard_bytes=int(args.shard_mb * 1e6) if args.shard_mb else None)
        print(ds)
    elif args.lab_command == "demo":
        from dataferry.course.lab.demo import run_demo

        started = not lab.running
        lab.up()
        try:
            run_demo(lab)
        finally:
            if started:
                lab.down()
    elif args.lab_command == "build":
        for name in TOOLS:
            path, version = ensure_tool(name, lab.tools)
            print(f"{name} {version} {path}")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from dataferry.cache import Cache
    from dataferry.sources import LocalSource, NotFoundAtSource, from_uri
    from dataferry.staging import stage

    source = from_uri(args.source)
    if isinstance(source, LocalSource) and not source.root.is_dir():
        raise NotFoundAtSource(f"{source.root} is not a folder: check the path (is the drive mounted?); no cache "
                               "was made")
    if args.rank >= args.world_size:
        raise ValueError(f"--rank {args.rank} with --world-size {args.world_size}: a rank is 0 to world size - 1")
    cache = Cache(args.cache, max_bytes=args.max_bytes, min_free_bytes=args.min_free_bytes)
    report = stage(source, cache, workers=args.workers, rank=args.rank, world_size=args.world_size,
                   in_flight=args.in_flight)
    return 1 if report.failures else 0


def cmd_shards(args: argparse.Namespace) -> int:
    from dataferry.shards import make_shards

    made = make_shards(args.source, args.dest, shard_bytes=int(args.shard_mb * 2**20))
    print(f"{sum(s.samples for s in made)} samples in {len(made)} shards "
          f"({sum(s.bytes for s in made) / 1e6:,.1f} MB) and index.json in {args.dest}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from dataferry.cache import Cache
    from dataferry.errors import byte_count

    if args.cache_command == "prune":
        byte_count("max_bytes", args.max_bytes)  # before the cache is opened: a bad argument touches nothing
    cache = Cache.existing(args.root)
    if args.cache_command == "inspect":
        print(cache)
        rows = cache.entries()
        by_source: dict[str, list[int]] = {}
        for row in rows:
            by_source.setdefault(row["source"], []).append(row["size"])
        for source, sizes in by_source.items():
            print(f"  {source}: {len(sizes)} objects, {sum(sizes) / 1e6:.1f} MB")
        filling = sum(1 for r in rows if r["state"] == "filling")
        if filling:
            print(f"  {filling} fills in progress")
    elif args.cache_command == "verify":
        report = cache.verify()
        for source, name, why in report.bad:
            print(f"bad: {source.rstrip('/')}/{name}: {why} (removed; it is fetched again on the next read)")
        print(report)
        return 0 if report.ok else 1
    elif args.cache_command == "prune":
        print(f"evicted {cache.prune(args.max_bytes)} entries; now {cache}")
    elif args.cache_command == "clear":
        cache.clear()
        print(f"cleared; now {cache}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """One of four experiments, by ``--au`` and ``--lab``; an option left out is left to the experiment's default."""
    from dataferry.errors import BadArgument
    from dataferry.harness.bench import KNOWN_METHODS, bench_source, check_methods
    from dataferry.harness.utilisation import AU_METHODS

    given = {k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose", "source", "lab", "au")}
    if "methods" in given:
        given["methods"] = given["methods"].split(",")
        check_methods(given["methods"], (*AU_METHODS, "folder") if args.au else KNOWN_METHODS)
    for folder in (given.get("out"), given.get("json_path") and os.path.dirname(given["json_path"])):
        if folder and os.path.exists(folder) and not os.path.isdir(folder):
            raise BadArgument(f"{folder} is a file; --out names a folder (for results.csv, run_meta.json and figures) "
                              "and --json a file in one: choose another path")

    def only(*names: str, **renamed: str) -> dict[str, Any]:
        """The options given that this experiment takes (``renamed``: the CLI's name -> the experiment's)."""
        return {renamed.get(k, k): v for k, v in given.items() if k in names or k in renamed}

    common = ("out", "json_path", "methods", "repeats", "seed")
    if args.au and args.lab:
        from dataferry.course.lab.methodsbench import bench_au_lab

        bench_au_lab(args.au, **only(*common, "profiles", "n_files", "file_bytes", "workers", passes="epochs"))
    elif args.au:
        from dataferry.harness.utilisation import bench_au

        bench_au(args.au, args.source, **only(*common, "n_files", "workers", "region", passes="epochs"))
    elif args.lab:
        from dataferry.course.lab.methodsbench import bench_lab

        bench_lab(**only(*common, "profiles", "n_files", "file_bytes", "passes"))
    else:
        bench_source(args.source, **only(*common, "passes", "region", n_files="max_files"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from dataferry.harness.results import load_results

    rows = load_results(args.results)  # before the figures' imports: a bad path touches nothing
    from dataferry.harness.bench import summary, summary_table
    from dataferry.harness.plots import standard_figures

    print(f"{len(rows)} rows from {rows['run_id'].nunique()} runs")
    print(summary_table(summary(rows)))
    for name, paths in standard_figures(rows, args.out).items():
        print(f"{name}: {', '.join(map(str, paths))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dataferry.cache.budget import DEFAULT_MIN_FREE_BYTES
    from dataferry.harness.feed import PROFILES as COMPUTE_PROFILES
    from dataferry.course.lab.profiles import PROFILES
    from dataferry.staging import MAX_IN_FLIGHT

    parser = Parser(prog="dataferry", description="Fast training data from cloud storage.")
    parser.add_argument("--version", action="version", version=f"dataferry {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="more log output")
    sub = parser.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="the offline cloud lab (fake-gcs-server, toxiproxy, gcsfuse)")
    lab.add_argument("--state-dir", type=path, help="lab state folder (default $DATAFERRY_LAB_STATE or ~/.cache/dataferry/lab)")
    labsub = lab.add_subparsers(dest="lab_command", required=True)
    up = labsub.add_parser("up", help="start the lab, or reuse the running one")
    up.add_argument("--profile", default="unshaped", choices=list(PROFILES))
    up.add_argument("--port", type=whole(1, 65535), help="fixed port for the client endpoint (default: a free one)")
    st = labsub.add_parser("status", help="what runs (exit code 3 when the lab is down)")
    st.add_argument("--json", action="store_true")
    labsub.add_parser("down", help="stop everything and remove the lab's temp folders")
    pr = labsub.add_parser("profile", help="list region profiles, or switch to one")
    pr.add_argument("name", nargs="?", choices=list(PROFILES))
    mo = labsub.add_parser("mount", help="mount a lab bucket with gcsfuse; prints the mount point")
    mo.add_argument("bucket", type=path)
    mo.add_argument("--file-cache", action="store_true", help="turn on gcsfuse's file cache")
    mo.add_argument("--at", type=path, help="mount point (default: a folder in the lab's run folder)")
    um = labsub.add_parser("unmount", help="unmount a lab mount")
    um.add_argument("mountpoint", type=path)
    ds = labsub.add_parser("dataset", help="upload a synthetic dataset to a lab bucket")
    ds.add_argument("bucket", type=path)
    ds.add_argument("--files", type=whole(1, 10**7), required=True)
    ds.add_argument("--size", type=whole(0, 2**40), required=True, help="bytes per file (the median with --sigma)")
    ds.add_argument("--sigma", type=amount(0, 10), default=0.0, help="log-normal spread of sizes (0: all equal)")
    ds.add_argument("--prefix", type=path, default="data")
    ds.add_argument("--seed", type=int, default=0)
    ds.add_argument("--shard-mb", type=amount(0, 1e6), default=64.0, help="tar shard size in MB (0: no shards)")
    labsub.add_parser("demo", help="a one-minute tour: API and gcsfuse reads under every profile")
    labsub.add_parser("build", help="build fake-gcs-server, toxiproxy and gcsfuse now")
    lab.set_defaults(func=cmd_lab)

    sh = sub.add_parser("shards", help="tar shards (WebDataset layout) to train from with dataferry.shards")
    shsub = sh.add_subparsers(dest="shards_command", required=True)
    mk = shsub.add_parser("make", help="pack the files of a bucket prefix or folder into shards, with an index")
    mk.add_argument("source", type=path, help="gs://bucket/prefix, or a folder; files named key.ext (0001.jpg, 0001.cls)")
    mk.add_argument("dest", type=path, help="gs://bucket/prefix, or a folder, for the shards and index.json")
    mk.add_argument("--shard-mb", type=MB, default=64.0, help="target shard size in MiB (default 64)")
    sh.set_defaults(func=cmd_shards)

    st = sub.add_parser("stage", help="copy a bucket prefix or folder into a local cache, in parallel")
    st.add_argument("source", type=path, help="gs://bucket/prefix, or a folder (e.g. a Drive or gcsfuse mount)")
    st.add_argument("--cache", type=path, required=True, help="cache folder")
    st.add_argument("--in-flight", type=whole(1, MAX_IN_FLIGHT), default=None,
                    help="fills at once: downloads in flight from a bucket (default 256), threads on a folder (default 32)")
    st.add_argument("--workers", type=whole(1, MAX_IN_FLIGHT), default=None, help="the older name of --in-flight")
    st.add_argument("--max-bytes", type=float, help="cache budget in bytes")
    st.add_argument("--min-free-bytes", type=float, default=DEFAULT_MIN_FREE_BYTES,
                    help=f"bytes the cache keeps free on its disk (default {DEFAULT_MIN_FREE_BYTES:,})")
    st.add_argument("--rank", type=whole(0, 10**6), default=0)
    st.add_argument("--world-size", type=whole(1, 10**6), default=1)
    st.set_defaults(func=cmd_stage)

    ca = sub.add_parser("cache", help="look after a cache folder")
    casub = ca.add_subparsers(dest="cache_command", required=True)
    for name, text in (("inspect", "entries and bytes per source"),
                       ("verify", "re-check every entry's size and crc32c; remove bad ones (exit 1 if any)"),
                       ("prune", "evict least-recently-used entries down to --max-bytes"),
                       ("clear", "remove every entry")):
        p = casub.add_parser(name, help=text)
        p.add_argument("root", type=path, help="cache folder")
        if name == "prune":
            p.add_argument("--max-bytes", type=float, required=True)
    ca.set_defaults(func=cmd_cache)

    be = sub.add_parser("bench", help="first vs repeated reads by method: on your data, or --lab across profiles",
                        argument_default=argparse.SUPPRESS)
    where = be.add_mutually_exclusive_group(required=True)
    where.add_argument("source", nargs="?", type=path, default=None,
                       help="gs://bucket/prefix, or a folder (e.g. a Drive or gcsfuse mount)")
    where.add_argument("--lab", action="store_true", default=False, help="run the full comparison in the offline lab")
    be.add_argument("--au", metavar="PROFILE[,PROFILE]", type=_compute_profiles, default=None,
                    help="instead of MB/s, the accelerator utilisation of each method training under these compute "
                         f"profiles ({', '.join(sorted(COMPUTE_PROFILES))}); --passes are epochs")
    be.add_argument("--methods", type=path, help="comma-separated (lab: local,gcsfuse,gcsfuse-cache,api-serial,api-parallel,"
                                      "dataferry; a gs:// source: api-serial,api-parallel,dataferry,gcsfuse,"
                                      "gcsfuse-cache; a folder: folder,dataferry)")
    be.add_argument("--passes", type=whole(1, 1000), help="epochs per method; pass 1 is the first read (default 2)")
    be.add_argument("--repeats", type=whole(1, 1000), help="rounds of every method (default 5)")
    be.add_argument("--files", dest="n_files", metavar="N", type=whole(1, 10**7),
                    help="files to read (a sample of the source); default 24, with --au 256")
    be.add_argument("--file-kib", dest="file_bytes", metavar="KIB", type=lambda text: whole(1, 2**24)(text) << 10,
                    help="lab: size of each file; default 2048, with --au 112")
    be.add_argument("--workers", type=whole(0, 1024), help="--au: DataLoader worker processes (default 4)")
    be.add_argument("--profiles", type=lambda text: names(list(PROFILES))(text).split(","),
                    help="lab: region profiles (default colocated,same-continent,cross-continent; with --au "
                         "same-continent,cross-continent)")
    be.add_argument("--region", type=path, help="your region, if detection cannot know it (else metadata server, else unknown)")
    be.add_argument("--seed", type=whole(0))
    be.add_argument("--out", type=path, help="folder for results.csv, run_meta.json and figures (default build/bench/...)")
    be.add_argument("--json", dest="json_path", metavar="FILE", type=path, help="where to write the summary JSON")
    be.set_defaults(func=cmd_bench)

    rp = sub.add_parser("report", help="pool result files and redraw the standard figures")
    rp.add_argument("results", nargs="+", type=path, help="results.csv files or folders holding them")
    rp.add_argument("--out", type=path, default="build/report", help="folder for the figures")
    rp.set_defaults(func=cmd_report)

    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """Warnings from the command, as one line each (not Python's two, with a source line)."""
    print(f"dataferry: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dataferry`` console script."""
    return run(build_parser, argv)


def run(make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` with the parser ``make_parser`` builds and run the chosen command. Errors print one line and exit 2; Ctrl-C, at any moment
    (while it starts up too), one line and 130."""
    try:
        args = make_parser().parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                            format="%(name)s: %(message)s", stream=sys.stderr)
        from dataferry.errors import DataferryError

        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warning
                return args.func(args)
        except (DataferryError, ValueError, OSError) as e:
            print(f"dataferry: error: {e}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("dataferry: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
