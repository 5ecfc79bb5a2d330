"""`dataferry bench --lab`, `dataferry bench FOLDER` and `dataferry report`, end to end on small data."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dataferry.harness.bench import LAB_METHODS, PARALLEL_WORKERS
from dataferry.course.lab import plan_dataset
from dataferry.harness.results import load_results

FIGURES = {"first_vs_repeat", "by_region", "by_runtime", "per_epoch"}


def _cli(*args, env=None):
    if args[0].startswith("bench-"):  # the benchmarks against peers: the repository's benchmarks/, not the package
        args = ("-m", "benchmarks", args[0].removeprefix("bench-"), *args[1:])
    else:
        args = ("-m", "dataferry.course.cli", *args)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=900, env={**__import__("os").environ, "MPLBACKEND": "Agg", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    stdout = _cli("bench", "--lab", "--files", "4", "--file-kib", "256", "--repeats", "2", "--passes", "2",
                  "--profiles", "cross-continent", "--out", str(out / "run"), "--json", str(out / "methods.json"))
    return out, stdout


def test_lab_bench_has_every_methods_rows_with_state_and_region(lab_run):
    out, stdout = lab_run
    rows = load_results(out / "run")
    epochs = rows[rows["phase"] == "epoch"]
    assert (epochs["error"] == "").all(), epochs[epochs["error"] != ""]["error"].tolist()
    assert set(epochs["method"]) == set(LAB_METHODS)
    for method in LAB_METHODS:
        got = epochs[epochs["method"] == method]
        assert sorted(got["pass"].tolist()) == [1, 1, 2, 2], method
    timed = rows[rows["phase"] != "h2d"]
    assert (timed["region"] == "lab:cross-continent").all() and (timed["region_source"] == "lab").all()
    assert (timed["cache_state"] != "").all()
    assert set(rows[rows["phase"] == "read"]["cache_state"]) <= {"cold_verified", "cold_unverified", "page_warm",
                                                                  "daemon_warm", "local_copy"}
    assert set(rows["phase"]) >= {"list", "read", "download", "stage", "epoch"}
    reads = rows[(rows["phase"] == "read") & (rows["error"] == "")]
    assert (reads["bytes"] == 256 * 1024).all(), "bytes come from what the reads returned"
    meta = json.loads((out / "run" / "run_meta.json").read_text())
    assert meta["seed"] == 0 and meta["runtime"]["kind"] and meta["profiles"]["cross-continent"]["rtt_ms"] == 120


def test_folder_methods_read_as_wide_as_the_api_and_the_serial_variant_one_file_at_a_time(lab_run):
    """A DataLoader with workers reads a mount in parallel: gcsfuse, its file cache and local disk are read
    by as many threads as api-parallel downloads with, and "-serial" keeps the 2020 post's one-at-a-time."""
    out, _ = lab_run
    rows = load_results(out / "run")
    ok = rows[rows["error"] == ""]
    widths = {"gcsfuse": PARALLEL_WORKERS, "gcsfuse-cache": PARALLEL_WORKERS, "local": PARALLEL_WORKERS,
              "api-parallel": PARALLEL_WORKERS, "gcsfuse-serial": 1, "api-serial": 1}
    for method, width in widths.items():
        epochs = ok[(ok["phase"] == "epoch") & (ok["method"] == method)]
        assert len(epochs) == 4 and (epochs["concurrency"] == width).all(), (method, epochs["concurrency"].tolist())
    first = ok[ok["pass"] == 1]
    for (method, repeat), reads in first[(first["phase"] == "read") &
                                         first["method"].isin(["gcsfuse", "gcsfuse-serial"])].groupby(["method", "repeat"]):
        epoch = first[(first["phase"] == "epoch") & (first["method"] == method) & (first["repeat"] == repeat)]
        wall, busy = int(epoch["ns"].iloc[0]), int(reads["ns"].sum())
        if method == "gcsfuse":  # four 120 ms round trips at once: the reads overlap
            assert busy > 2 * wall, (method, repeat, busy, wall)
        else:
            assert busy <= wall, (method, repeat, busy, wall)


def test_lab_bench_writes_figures_table_and_json(lab_run):
    out, stdout = lab_run
    summary = json.loads((out / "methods.json").read_text())
    assert set(summary["figures"]) == FIGURES
    for paths in summary["figures"].values():
        assert all(Path(p).stat().st_size > 1000 for p in paths) and {Path(p).suffix for p in paths} == {".svg", ".png"}
    assert "| lab:cross-continent | gcsfuse |" in stdout and "repeat / first" in stdout
    checks = summary["checks"]["lab:cross-continent"]
    assert 0.5 <= checks["gcsfuse_repeat_over_first"] <= 2, "gcsfuse without a file cache re-reads from the 'cloud'"
    assert checks["dataferry_repeat_over_first"] >= 10, "a local copy beats a far-away bucket"


def test_report_redraws_figures_from_result_files(lab_run, tmp_path):
    out, _ = lab_run
    stdout = _cli("report", str(out / "run"), "--out", str(tmp_path / "fig"))
    assert {p.stem for p in (tmp_path / "fig").glob("*.png")} == FIGURES
    assert "rows from 1 runs" in stdout


def test_bench_on_a_folder(tmp_path):
    plan_dataset(5, 10_000, seed=3, shard_bytes=None).write_to(tmp_path / "data")
    stdout = _cli("bench", str(tmp_path / "data"), "--repeats", "1", "--out", str(tmp_path / "run"),
                  "--region", "europe-west4")
    rows = load_results(tmp_path / "run")
    epochs = rows[rows["phase"] == "epoch"]
    assert set(epochs["method"]) == {"folder", "dataferry"} and (epochs["error"] == "").all()
    assert set(rows["region"]) - {""} == {"europe-west4"} and set(rows["region_source"]) - {""} == {"override"}
    assert "| europe-west4 | folder |" in stdout


def test_a_target_made_without_a_work_folder_keeps_its_copy_in_the_labs_run_folder():
    """``lab_target`` with no ``work`` (as a lesson calls it) puts its local copy in the lab's run folder,
    so ``lab down`` removes it, even when the kernel that made it was killed."""
    from dataferry.course.lab import Lab
    from dataferry.course.lab.methodsbench import lab_target

    with Lab.private(gcsfuse=False) as lab:
        target = lab_target(lab, "own-target", 3, 1000, seed=1)
        run_dir = Path(lab.state["run_dir"])
        assert target.local_copy is not None and target.local_copy.is_relative_to(run_dir)
        assert sorted(p.stat().st_size for p in target.local_copy.rglob("*") if p.is_file()) == [1000] * 3
    assert not run_dir.exists()


def test_a_run_over_files_of_many_sizes_is_one_size_class(tmp_path):
    """Real data sets (the public images) have files of many sizes: aggregate rows carry the run's mean
    file size, so a run's epochs are never split by whichever file happened to be shuffled first."""
    from dataferry.course.lab.datasets import LogNormal

    plan = plan_dataset(12, LogNormal(20_000, 1.0), seed=5, shard_bytes=None).write_to(tmp_path / "data")
    _cli("bench", str(tmp_path / "data"), "--repeats", "3", "--out", str(tmp_path / "run"))
    rows = load_results(tmp_path / "run")
    aggregate = rows[rows["phase"].isin(["epoch", "stage"])]
    sizes = rows[rows["phase"] == "read"].groupby("file")["file_bytes"].first()
    assert set(plan.sizes.values()) <= set(sizes), "single reads keep their own file's size"
    assert len(aggregate) >= 6 and set(aggregate["file_bytes"]) == {round(sizes.sum() / len(sizes))}


def test_peer_first_epochs_read_every_byte_of_the_same_objects(gcsfuse_lab, lab_bucket, tmp_path):
    """The peer section of `make bench-cache` on small data: every method, dataferry's and the
    peers' (gcsfs, transfer_manager, gcsfuse's file cache), reads all of the same objects, cold."""
    from benchmarks.peers import DATAFERRY, DISK, PEERS, first_epochs, ratios

    ds = plan_dataset(30, 20_000, prefix="peer", seed=6, shard_bytes=None).upload(lab_bucket)
    runs = first_epochs(gcsfuse_lab, lab_bucket.name, "peer/files/", tmp_path / "work", (*PEERS, *DATAFERRY, DISK),
                        repeats=1, seed=3, say=lambda _: None)
    for method, (run,) in runs.items():
        assert (run["files"], run["bytes"]) == (30, ds.total_bytes), method
        assert run["seconds"] > 0 and run["peak_rss_mib"] > 0
        # the whole machine's busy CPU over the run includes the method's own (ticks of 10 ms)
        assert 0 <= run["cpu_s"] <= run["machine_cpu_s"] + 0.05, method
        # a method that downloads in its own process spends CPU there; gcsfuse's reader may not (its
        # daemon downloads), and 30 small reads can take under one 10 ms tick
        assert run["cpu_s"] > 0 or method in ("gcsfuse-file-cache", DISK), method
    summary = ratios(runs)
    assert summary["best_peer"] in PEERS
    for method, (run,) in runs.items():
        row = summary["methods"][method]
        assert (row["median_cpu_s"], row["median_machine_cpu_s"]) == (run["cpu_s"], run["machine_cpu_s"])
        assert row["machine_busy"] == run["machine_cpu_s"] / (run["seconds"] * os.cpu_count())
    assert all(summary[f"{m}_vs_best_peer"] > 0 and summary[f"{m}_vs_limit"] > 0 for m in DATAFERRY)
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("*.bin")), "nothing left behind"


def test_first_epochs_against_the_best_peer_are_taken_repetition_by_repetition():
    """Each repetition's methods run one after another: dataferry's ratio is the median of the repetitions'
    ratios to the peer with the fastest median."""
    from benchmarks.peers import ratios

    def runs(*seconds):
        return [{"seconds": s, "bytes": 60e6, "files": 1, "peak_rss_mib": 1, "cpu_s": 1, "machine_cpu_s": 1}
                for s in seconds]

    summary = ratios({"gcsfs-get": runs(1.5, 3.0, 1.2), "gcsfuse-file-cache": runs(3.0, 3.0, 3.0),
                      "dataferry-stage": runs(1.0, 2.0, 0.8), "dataferry-first-read": runs(2.0, 1.0, 2.4)})
    assert summary["best_peer"] == "gcsfs-get"
    assert summary["dataferry-stage_vs_best_peer_rounds"] == pytest.approx([1.5, 1.5, 1.5])
    assert summary["dataferry-stage_vs_best_peer"] == pytest.approx(1.5)
    assert summary["dataferry-first-read_vs_best_peer"] == pytest.approx(0.75)  # rounds 0.75, 3.0, 0.5
    assert "dataferry-stage_vs_limit" not in summary, "no disk measured: no limit"
    with_disk = ratios({"gcsfs-get": runs(1.5, 3.0, 1.2), "dataferry-stage": runs(1.0, 2.0, 0.8),
                        "dataferry-first-read": runs(2.0, 1.0, 2.4), "local-durable-write": runs(2.0, 1.0, 2.4)})
    # each round over the slower of the best peer and the disk: 1.0/2.0, 2.0/3.0, 0.8/2.4 seconds
    assert with_disk["dataferry-stage_vs_limit_rounds"] == pytest.approx([2.0, 1.5, 3.0])
    assert with_disk["dataferry-first-read_vs_limit"] == pytest.approx(1.0)


def test_bench_au_in_the_lab_prints_and_writes_utilisation_per_profile_method_and_epoch(tmp_path):
    stdout = _cli("bench", "--au", "resnet50-v100-fp32,smallcnn-h100-amp", "--lab", "--files", "8", "--file-kib", "64",
                  "--repeats", "1", "--passes", "2", "--profiles", "colocated", "--methods", "local,cache",
                  "--out", str(tmp_path / "au"))
    for compute in ("resnet50-v100-fp32", "smallcnn-h100-amp"):
        assert re.search(rf"\| 8 \| 64 KiB \| lab:colocated \| [\w-]+ \| {compute} \| cache \| 2 \|", stdout), stdout
        assert re.search(rf"<ComputeProfile {compute}: .*> needs [0-9.]+ MB/s", stdout)
    result = json.loads((tmp_path / "au" / "au.json").read_text())
    assert not result["errors"]
    assert sorted((a["compute_profile"], a["method"], a["epoch"]) for a in result["au"]) == [
        (c, m, e) for c in ("resnet50-v100-fp32", "smallcnn-h100-amp") for m in ("cache", "local") for e in (1, 2)]
    assert all(0 < a["median"] <= 1 for a in result["au"])
    assert {n["compute_profile"]: round(n["needs_MBps"], 1) for n in result["needs"]} == {
        "resnet50-v100-fp32": round(367 * 64 * 1024 / 1e6, 1), "smallcnn-h100-amp": round(35359 * 64 * 1024 / 1e6, 1)}
    rows = load_results(tmp_path / "au")
    assert (rows["phase"] == "train").all()
    assert set(rows["compute_profile"]) == {"resnet50-v100-fp32", "smallcnn-h100-amp"}


def test_bench_shards_reads_every_sample_each_epoch_and_keeps_the_cache_under_its_budget(tmp_path):
    """`dataferry bench-shards` on small data: shards through the cache, files through the cache and
    webdataset's cache each give every sample every epoch; dataferry's disk stays under the budget and
    its first epoch fetches each shard once, its second fewer."""
    out = tmp_path / "shards.json"
    stdout = _cli("bench-shards", "--samples", "160", "--sample-kib", "16", "--shard-mb", "0.25", "--budget-share",
                  "0.4", "--epochs", "2", "--repeats", "1", "--workers", "1", "--batch", "16", "--profile", "unshaped",
                  "--out", str(out))
    got = json.loads(out.read_text())
    assert set(got["runs"]) == {"dataferry-shards", "dataferry-files", "webdataset-cache"}
    for method, epochs in got["runs"].items():
        assert [(e["epoch"], e["samples"], e["bytes"]) for e in epochs] == [(1, 160, 160 << 14), (2, 160, 160 << 14)], method
        assert [e["cache_state"] for e in epochs][0] == "cold_empty" and epochs[1]["cache_state"].startswith("cold"), method
    shards, files = got["runs"]["dataferry-shards"], got["runs"]["dataferry-files"]
    assert all(0 < e["peak_disk_bytes"] <= got["budget_bytes"] for e in shards)
    assert shards[0]["served_bytes"] == got["shards_bytes"] and shards[0]["requests"] == got["shards"]
    assert shards[1]["served_bytes"] < got["shards_bytes"], "a shard kept from epoch 1 is read from disk in epoch 2"
    assert files[0]["served_bytes"] >= got["files_bytes"] and got["runs"]["webdataset-cache"][0]["served_bytes"] >= got["shards_bytes"]
    assert "| dataferry-shards |" in stdout and "| webdataset-cache |" in stdout and "lab:unshaped" in stdout
    assert Path(got["figure"]).stat().st_size > 10_000


def test_bench_train_has_a_row_per_reader_decoder_and_width_and_its_two_ratios(tmp_path):
    """`dataferry bench-train` on small data: every reader, decoder and worker count gives a whole epoch into
    the emulated accelerator, and the JSON holds both ratios with their goals, and epoch 1 from a gcsfuse
    mount with the prefetching sampler and without."""
    out = tmp_path / "train.json"
    stdout = _cli("bench-train", "--images", "25", "--batch", "8", "--repeats", "1", "--plain-files", "200",
                  "--profile", "unshaped", "--out", str(out))
    got = json.loads(out.read_text())
    widths = sorted({1, os.cpu_count()})
    readers = {(r["reader"], r["decoder"], r["workers"]) for r in got["rows"]}
    for w in widths:
        for d in ("pil", "pil-reduced", "torchvision"):
            assert {("imagefolder-local", d, w), ("cache-cold", d, w), ("cache-warm", d, w)} <= readers
        assert {("decode-once-cold", "pil@256", w), ("decode-once-warm", "pil@256", w)} <= readers
        assert ("limit-in-memory", "pixels@256", w) in readers, "this machine's limit: decoded pixels in RAM"
    for r in got["rows"]:
        assert r["samples_per_s"] > 0 and 0 < r["au"] <= 1.05 and 0 <= r["wait_share"] <= 1, r
    assert got["decode_once_vs_jpeg_warm"] > 0 and got["cold_epoch_vs_plain_read"] > 0
    assert ("decode-once-budget", "pil@256", widths[-1]) in readers and got["budget_vs_none"] > 0
    assert "budget_vs_none" in stdout, "decode-once under a budget, against the same cache without one"
    assert len(got["copies_written_files_per_s"]) == 1 and got["cold_epoch_vs_read_then_write"] > 0
    assert "cold_epoch_vs_read_then_write" in stdout, "epoch 1 against what reading and then writing allow"
    from dataferry.mounts.fuse import fuse_status

    mounted = got["mounted_files_per_s"]
    if fuse_status()[0]:  # the lab mounts with gcsfuse wherever FUSE works (CI: yes)
        assert len(mounted["prefetching"]) == len(mounted["without"]) == 1 and got["mounted_prefetch_gain"] > 0
    else:
        assert got["mounted_prefetch_gain"] is None and "not measured (no gcsfuse)" in stdout
    assert "mounted_prefetch_gain" in stdout
    assert set(got["goals"]) == {"decode_once_vs_jpeg_warm", "decode_once_vs_limit", "decode_once_vs_best_peer",
                                 "jpeg_cache_vs_best_peer", "cold_epoch_vs_plain_read"}
    from dataferry.decode import DECODERS

    assert set(got["stage_us"]) == {*(f"cache-warm {d}" for d in DECODERS), "decode-once-warm pil@256",
                                    "limit-in-memory pixels@256"}
    assert all(got["stage_us"][p]["augment"] > 0 and got["stage_us"][p]["collate"] > 0 for p in got["stage_us"])
    assert got["stage_us"]["cache-warm pil"]["decode"] > got["stage_us"]["decode-once-warm pil@256"]["decode"]
    assert "| pipeline | read | decode | augment | collate | hand-over and the rest |" in stdout
    from benchmarks.feedpeers import missing

    top, gone = widths[-1], missing()
    assert got["peers_missing"] == gone and got["decode_once_vs_best_peer"] > 0 and got["jpeg_cache_vs_best_peer"] > 0
    if gone:  # CI: the feed's peers are make bench-train's extra; ImageFolder is a peer everywhere
        assert f"not measured: {', '.join(gone)}" in stdout
    else:
        assert {("litdata", d, top) for d in DECODERS} | {("dali-cpu", "dali", top)} <= readers
    assert all(ms > 0 for ms in got["decode_ms_per_sample"].values())
    assert "| decode-once-warm |" in stdout and "lab:unshaped" in stdout and "decode_once_vs_jpeg_warm" in stdout


def test_the_dataferry_method_imports_its_transport_before_the_clock(tmp_path):
    """Every method's modules are imported before its timed span: dataferry's transport (aiohttp, ~90 ms to
    import here) used to be imported inside its first pass, which made it the slowest first read of a small
    run. A fresh interpreter, so that no earlier test has imported it."""
    code = ("import sys; from pathlib import Path; from dataferry.harness.bench.methods import Target, method_state\n"
            "assert 'dataferry.gcs_media' not in sys.modules\n"
            f"with method_state('dataferry', Target(names=['a'], sizes={{'a': 1}}), Path({str(tmp_path)!r})):\n"
            "    assert 'dataferry.gcs_media' in sys.modules and 'aiohttp' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_shard_comparison_summarises_every_repeat_not_the_last():
    """Lesson 09 runs the side-by-side comparison REPEATS times: epoch 1's rate is the median over the repeats,
    later epochs' over every later epoch of every repeat, and the figure draws each repeat."""
    pytest.importorskip("matplotlib")
    from dataferry.course.lab.shardepochs import plot_shard_epochs, summarize

    def epoch(repeat, n, seconds, served=100):
        return {"repeat": repeat, "epoch": n, "samples": 100, "seconds": seconds, "bytes": 1000, "served_bytes": served,
                "requests": 1, "peak_disk_bytes": 50 * repeat, "cache_state": "x"}

    runs = {"dataferry-shards": [epoch(r, e, s) for r, times in ((1, (1.0, 0.5)), (2, (2.0, 0.25)), (3, (4.0, 0.2)))
                                 for e, s in zip((1, 2), times)]}
    row = summarize(runs, budget=100)["dataferry-shards"]
    assert row["repeats"] == 3
    assert row["first_samples_per_s"] == 50.0, "median of 100, 50 and 25 samples/s"
    assert row["later_samples_per_s"] == 400.0, "median of 200, 400 and 500 samples/s"
    assert row["peak_disk_vs_budget"] == 1.5
    fig = plot_shard_epochs(runs, 100, 1000, "lab:test")
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == 6, "a dot for every epoch of every repeat"


def test_the_litdata_peer_leaves_the_start_method_and_the_temp_folder_as_they_were(tmp_path):
    """litdata's optimize sets the process's multiprocessing start method to spawn for good (every later DataLoader
    then started its workers slower: the next rows of the benchmark ran at a quarter of their speed) and writes
    into the system's temp folder; the peer puts both back."""
    import multiprocessing

    pytest.importorskip("litdata")
    from benchmarks.feedpeers import litdata_loader
    from dataferry.course.lab.flowers import plan_flowers

    plan_flowers(2, seed=3, prefix="").write_to(tmp_path / "photos")
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)  # one litdata never picks, whatever it detects
    try:
        loader = litdata_loader(tmp_path / "photos", tmp_path / "work", len, lambda n: n, 0, 4)
        assert multiprocessing.get_start_method(allow_none=True) == "forkserver"
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert sorted(n for batch in loader for n in batch[1].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_bench_train_takes_each_ratio_round_by_round_against_the_peer_fastest_overall():
    """A machine that slows down between rounds slows both sides of a round alike: a ratio is taken round by round
    (its median is the figure); the peer compared is the one with the fastest median, each round against that same
    peer's epoch of the round."""
    from benchmarks.peers import per_round
    from benchmarks.train import _rates, _vs_best_peer

    def rows(reader, decoder, rates):
        return [{"reader": reader, "decoder": decoder, "workers": 2, "samples_per_s": r} for r in rates]

    table = (rows("decode-once-warm", "pil@256", [400, 200, 300]) + rows("cache-warm", "pil", [200, 100, 150])
             + rows("imagefolder-local", "pil", [100, 300, 200]) + rows("litdata", "pil", [250, 50, 120]))
    once, jpeg = _rates(table, "decode-once-warm", "pil@256", 2), _rates(table, "cache-warm", "pil", 2)
    assert per_round(once, jpeg) == [2.0, 2.0, 2.0]
    assert _vs_best_peer(table, jpeg, "pil", 2) == [2.0, 1 / 3, 0.75]  # ImageFolder: median 200 > 120
    assert _vs_best_peer(table, once, None, 2) == [4.0, 2 / 3, 1.5]
    assert _vs_best_peer(table, _rates(table, "cache-warm", "torchvision", 2), "torchvision", 2) == []
    with pytest.raises(ValueError):
        per_round([1.0, 2.0], [1.0])  # rounds that do not pair are a bug, not a ratio
