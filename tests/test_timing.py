"""The harness: cache-state control, spans, result files that survive interruption."""

import json
import os
import signal
import subprocess
import sys

import pytest

from dataferry.harness.pagecache import evict, residency_state, resident_fraction
from dataferry.harness.results import COLUMNS, SCHEMA_VERSION, Results, load_results
from dataferry.harness.timing import time_h2d, timed_read


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3_000_000))
    return path


def test_eviction_makes_a_file_non_resident_and_the_state_says_so(data_file):
    timed_read(data_file)
    assert resident_fraction(data_file) == 1.0
    assert residency_state([data_file]) == "page_warm", "without eviction the state is warm"
    report = evict([data_file])
    assert resident_fraction(data_file) == 0.0
    assert report.verified and report.cache_state == "cold_verified" and "posix_fadvise" in report.method
    assert residency_state([data_file]) == "cold_verified"
    with open(data_file, "rb") as f:
        f.read(100_000)  # part of it back in memory
    assert residency_state([data_file]) == "cold_unverified"


def test_timed_read_spans_and_bytes(data_file):
    s = timed_read(data_file, chunk=1 << 20)
    assert s.bytes == 3_000_000 and 0 < s.first_byte_ns <= s.read_ns


def test_timed_read_spans_measure_when_bytes_arrive(tmp_path):
    """A pipe whose writer waits 0.3 s before the first byte and 0.3 s more before the rest: the
    spans must say so (first byte ~0.3 s, whole read ~0.6 s), as a slow mount's reads would."""
    import threading
    import time

    pipe = tmp_path / "slow"
    os.mkfifo(pipe)

    def writer():
        with open(pipe, "wb", buffering=0) as f:
            time.sleep(0.3)
            f.write(b"a" * 1000)
            time.sleep(0.3)
            f.write(b"b" * 999_000)

    t = threading.Thread(target=writer)
    t.start()
    s = timed_read(pipe, chunk=1 << 20)
    t.join()
    assert s.bytes == 1_000_000, "bytes are what the reads returned"
    assert 0.25e9 < s.first_byte_ns < 0.5e9
    assert 0.55e9 < s.read_ns < 1.2e9 and s.ns >= s.read_ns
    assert s.MBps < 1_000_000 / 0.55e9 * 1e3, "the rate counts the waiting"


def _row(i):
    return dict(method="local", region="lab:x", region_source="lab", runtime="local-cpu", file=f"f{i}",
                file_bytes=100, bytes=100, repeat=1, cache_state="cold_verified", phase="read", ns=1000 + i,
                concurrency=1, **{"pass": 1})


def test_results_round_trip(tmp_path):
    with Results(tmp_path / "run", {"seed": 7}) as results:
        written = [results.add(**_row(i)) for i in range(5)]
        results.add(method="gcsfuse", phase="epoch", error="MountError: boom", **{"pass": 0})
    rows = load_results(tmp_path / "run")
    assert list(rows.columns) == COLUMNS and len(rows) == 6
    assert rows["ns"].tolist()[:5] == [w["ns"] for w in written]
    assert rows["MBps"].tolist()[:5] == pytest.approx([100 / (1000 + i) * 1e3 for i in range(5)])
    assert rows["error"].tolist()[-1] == "MountError: boom" and rows["error"].tolist()[0] == ""
    meta = json.loads((tmp_path / "run" / "run_meta.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and meta["seed"] == 7 and meta["rows"] == 6
    with pytest.raises(ValueError, match="unknown result columns"):
        Results(tmp_path / "other").add(speed=1)


def test_an_interrupted_run_keeps_its_rows(tmp_path):
    code = (
        "import os, signal, sys\n"
        "from dataferry.harness.results import Results\n"
        "r = Results(sys.argv[1])\n"
        "for i in range(7):\n"
        "    r.add(method='m', phase='read', bytes=1, ns=1, file=str(i))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")])
    assert proc.returncode == -signal.SIGKILL
    assert load_results(tmp_path / "run")["file"].tolist() == [str(i) for i in range(7)]


def test_load_results_pools_runs_and_refuses_other_schemas(tmp_path):
    for name in ("a", "b"):
        with Results(tmp_path / name) as r:
            r.add(**_row(0))
    pooled = load_results(tmp_path)
    assert pooled["run_id"].nunique() == 2
    one = pooled["run_id"].iloc[1]
    only = load_results(tmp_path, run_id=one)
    assert only["run_id"].tolist() == [one] and only.index.tolist() == [0]
    meta = tmp_path / "b" / "run_meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "schema_version": 99}))
    with pytest.raises(ValueError, match="schema version 99"):
        load_results(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_results(tmp_path / "nothing-here")


def test_gpu_copies_say_why_they_are_skipped_without_cuda():
    import torch

    out = time_h2d(b"x" * 1000, repeats=2)
    if torch.cuda.is_available():
        assert {r["method"] for r in out} == {"h2d-pageable", "h2d-pinned"} and len(out) == 4
    else:
        assert out == "GPU copies skipped: no CUDA device here (torch.cuda.is_available() is False)"


def test_every_row_carries_the_run_bucket_location_and_version_1_runs_still_load(tmp_path):
    with Results(tmp_path / "new", {"bucket_location": "US-CENTRAL1"}) as r:
        r.add(method="api-serial", file="a", bytes=10, ns=100)
        r.add(method="api-serial", file="b", bytes=10, ns=100, bucket_location="EU")
    rows = load_results(tmp_path / "new")
    assert list(rows["bucket_location"]) == ["US-CENTRAL1", "EU"]
    old = tmp_path / "old"
    old.mkdir()
    v1 = [c for c in COLUMNS if c != "bucket_location"]
    (old / "results.csv").write_text(",".join(v1) + "\n" + ",".join("r1" if c == "run_id" else "" for c in v1) + "\n")
    (old / "run_meta.json").write_text(json.dumps({"schema_version": 1}))
    pooled = load_results([old, tmp_path / "new"])
    assert sorted(pooled["bucket_location"]) == ["", "EU", "US-CENTRAL1"]


def test_results_of_schema_2_read_with_empty_utilisation_columns(tmp_path):
    v2 = COLUMNS[:COLUMNS.index("au")]
    (tmp_path / "results.csv").write_text(",".join(v2) + "\n" + ",".join("r2" if c == "run_id" else "7" if c == "ns"
                                                                         else "" for c in v2) + "\n")
    (tmp_path / "run_meta.json").write_text(json.dumps({"schema_version": 2}))
    rows = load_results(tmp_path)
    assert list(rows.columns) == COLUMNS and rows["ns"].tolist() == [7]
    assert rows["au"].isna().all() and rows["samples"].isna().all() and rows["bound_by"].tolist() == [""]
