"""Bad arguments and paths, from the API and the CLI: each is a dataferry error (also the builtin its
callers catch) that says what went wrong and what to do; the CLI prints it as one line and exits 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dataferry import Cache, DataferryError, LocalSource, stage

EXE = str(Path(sys.executable).parent / "dataferry")


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dataferry: error:")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], errors[0]


@pytest.mark.parametrize("option,value", [("max_bytes", float("inf")), ("max_bytes", float("nan")),
                                          ("max_bytes", -5), ("min_free_bytes", -1), ("min_free_bytes", float("inf")),
                                          ("max_bytes", "lots")])
def test_a_budget_that_is_not_a_byte_count_is_refused(tmp_path, option, value):
    with pytest.raises(DataferryError, match=rf"{option}=.*finite number >= 0") as e:
        Cache(tmp_path / "c", **{option: value})
    assert isinstance(e.value, ValueError)


def test_a_cache_folder_that_is_a_file_or_too_long_a_name_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    for root, why in ((tmp_path / "file" / "cache", "not a folder"), (tmp_path / ("x" * 300), "too long")):
        with pytest.raises(DataferryError, match=why) as e:
            Cache(root)
        assert isinstance(e.value, OSError)
        _one_line_error(_cli("stage", str(tmp_path), "--cache", str(root)), why)
        _one_line_error(_cli("cache", "inspect", str(root)))


def test_min_free_bytes_larger_than_the_whole_disk_is_refused_before_anything_is_made(tmp_path):
    """Such a cache could never hold a byte: every fill would stream, slowly and silently. Say so at once."""
    import shutil

    total = shutil.disk_usage(tmp_path).total
    with pytest.raises(DataferryError, match=r"min_free_bytes=.* more than the whole disk") as e:
        Cache(tmp_path / "c" / "deeper", min_free_bytes=total + 1)
    assert isinstance(e.value, ValueError) and not (tmp_path / "c").exists()
    Cache(tmp_path / "c", min_free_bytes=total // 2)  # less than the disk: fine, even if more than is free


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_cli_budgets_that_are_not_byte_counts(tmp_path, value):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    _one_line_error(_cli("stage", str(tmp_path / "src"), "--cache", str(tmp_path / "c"), "--max-bytes", value),
                    "max_bytes")
    Cache(tmp_path / "c2")
    _one_line_error(_cli("cache", "prune", str(tmp_path / "c2"), "--max-bytes", value), "max_bytes")


def test_cli_stage_takes_min_free_bytes_and_the_refusal_names_it(tmp_path):
    """On a disk with less free than the default 1 GiB, the option the refusal names is there to use."""
    import shutil

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a" * 1000)
    more_than_free = str(shutil.disk_usage(tmp_path).free + 10**9)
    refused = _cli("stage", str(tmp_path / "src"), "--cache", str(tmp_path / "c"), "--min-free-bytes", more_than_free)
    assert refused.returncode == 1 and "--min-free-bytes" in refused.stdout, refused.stdout + refused.stderr
    proc = _cli("stage", str(tmp_path / "src"), "--cache", str(tmp_path / "c"), "--min-free-bytes", "0")
    assert proc.returncode == 0 and "1 downloaded" in proc.stdout, proc.stderr


def test_cli_bench_and_report_refuse_bad_paths_and_methods(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a" * 1000)
    (tmp_path / "afile").write_text("not a folder")
    _one_line_error(_cli("bench", str(tmp_path / "src"), "--out", str(tmp_path / "afile")), "afile", "folder")
    _one_line_error(_cli("bench", str(tmp_path / "src"), "--methods", "nonsense", "--out", str(tmp_path / "o")),
                    "nonsense", "local")
    _one_line_error(_cli("report", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "r")), "missing.csv")
    (tmp_path / "notes.csv").write_text("this,is\nnot,results\n")
    _one_line_error(_cli("report", str(tmp_path / "notes.csv"), "--out", str(tmp_path / "r")), "notes.csv",
                    "results.csv")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    _one_line_error(_cli("report", str(tmp_path / "binary.csv"), "--out", str(tmp_path / "r")), "binary.csv")


def test_compare_methods_refuses_an_unknown_method_before_measuring(tmp_path):
    from dataferry.harness.bench import compare_methods

    with pytest.raises(DataferryError, match="unknown method 'nonsense'"):
        compare_methods(None, None, ["local", "nonsense"], region=None, runtime_kind="cpu")


EXITING = textwrap.dedent("""
    import atexit, os, signal, sys, threading, time
    from dataferry import Cache, LocalSource
    from dataferry.cache import index

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell that ran the tests in the background ignores it

    cache = Cache(sys.argv[1], min_free_bytes=0)
    cache.read(LocalSource(sys.argv[2]), "a")  # a use to write at exit
    slow = index.IndexWriter._transaction
    def slow_transaction(*a, **k):
        time.sleep(1.5)
        return slow(*a, **k)
    index.IndexWriter._transaction = slow_transaction
    # Registered last, so it runs first at exit: Ctrl-C lands while the cache writes its index.
    atexit.register(lambda: threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start())
""")


def test_ctrl_c_while_exiting_is_one_line_and_a_failing_exit_status(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    proc = subprocess.run([sys.executable, "-c", EXITING, str(tmp_path / "c"), str(tmp_path / "src")],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 130 and "interrupted" in proc.stderr, (proc.returncode, proc.stderr)
    Cache(tmp_path / "c", min_free_bytes=0).verify()


def test_every_error_class_has_the_one_root():
    import dataferry.cache.errors as cache_errors
    import dataferry.checkpoints as checkpoints
    import dataferry.course.lab.errors as lab_errors
    import dataferry.mounts as mounts
    import dataferry.shards as shards
    import dataferry.sources as sources

    classes = [cache_errors.ChecksumError, cache_errors.DamagedAtSource, cache_errors.DamagedOnDisk,
               cache_errors.CacheFolderError, cache_errors.FillTimeout,
               checkpoints.CheckpointError, lab_errors.LabError, mounts.MountError, mounts.NotInColab,
               shards.ShardFormatError, sources.SourceError, sources.NotFoundAtSource, sources.NoCredentials]
    assert [c.__name__ for c in classes if not issubclass(c, DataferryError)] == []


def test_stage_api_on_an_empty_folder_says_nothing_matched(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataferryError, match="nothing to stage"):
        stage(LocalSource(tmp_path / "empty"), Cache(tmp_path / "c"), progress=False)


# -- raw errors that escaped the one root, and arguments accepted without complaint (issue 35, item 14) ------


def test_raw_errors_of_the_api_are_dataferry_errors_that_say_what_to_do(tmp_path):
    from dataferry import GCSSource, ShardDataset, make_shards
    from dataferry.checkpoints import Checkpoints

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a" * 10)
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = {
        "a bucket name with a slash": lambda: GCSSource("a/b"),
        "a bucket name with spaces": lambda: GCSSource("Bad Bucket!"),
        "no bucket name": lambda: GCSSource(""),
        "a name leading out of a folder": lambda: LocalSource(tmp_path / "src").stat("../x"),
        "an empty folder path": lambda: LocalSource(""),
        "no shards": lambda: ShardDataset(LocalSource(tmp_path / "empty"), Cache(tmp_path / "c", min_free_bytes=0)),
        "packing an empty folder": lambda: make_shards(LocalSource(tmp_path / "empty"), tmp_path / "out", progress=False),
        "packing onto a file": lambda: make_shards(LocalSource(tmp_path / "src"), tmp_path / "afile", progress=False),
        "a shard size of 0": lambda: make_shards(LocalSource(tmp_path / "src"), tmp_path / "o2", shard_bytes=0,
                                                 progress=False),
        "shards into gs://": lambda: make_shards(LocalSource(tmp_path / "src"), "gs://", progress=False),
        "checkpoints in gs://": lambda: Checkpoints("gs://", work=tmp_path / "w"),
        "checkpoints in a bad bucket": lambda: Checkpoints("gs://Bad Bucket!/x", work=tmp_path / "w"),
        "a NUL in a checkpoint's name": lambda: Checkpoints(tmp_path / "k", name="a\0b", work=tmp_path / "w"),
        "stage 10^9 in flight": lambda: stage(LocalSource(tmp_path / "src"), Cache(tmp_path / "c", min_free_bytes=0),
                                              in_flight=10**9, progress=False),
    }
    for what, call in cases.items():
        with pytest.raises(DataferryError) as e:
            call()
            pytest.fail(f"{what}: no error")
        assert len(str(e.value).splitlines()) == 1, (what, str(e.value))
    assert not (tmp_path / "o2").exists() and not (tmp_path / "out").exists() and not (tmp_path / "k").exists()


def test_an_empty_cache_path_is_refused_and_the_current_folder_untouched(tmp_path, monkeypatch):
    """Path("") is the current folder: a cache there writes CACHEDIR.TAG ('safe to delete') beside a user's notebooks."""
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        with pytest.raises(DataferryError, match="empty"):
            Cache(empty)
    assert list(tmp_path.iterdir()) == []


def test_torch_compute_on_cuda_without_cuda_is_a_bad_argument():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from dataferry.harness.feed import TorchCompute

    with pytest.raises(DataferryError, match="EmulatedCompute"):
        TorchCompute("smallcnn", device="cuda")


def test_ctrl_c_while_the_command_starts_up_is_one_line_and_status_130(monkeypatch, capsys):
    import dataferry.course.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["cache", "inspect", "x"]) == 130
    assert capsys.readouterr().err == "dataferry: interrupted\n"


def test_a_lab_dataset_with_a_negative_spread_is_refused():
    from dataferry.course.lab.datasets import LogNormal

    for sigma in (-1, float("nan"), float("inf")):
        with pytest.raises(DataferryError, match="sigma"):
            LogNormal(1000, sigma)
