"""Every subcommand of the ``dataferry`` command, given missing, empty, wrong-type, negative, huge and NaN
arguments: one line (``dataferry: error: ...``), a non-zero exit status, and nothing created or changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


from benchmarks.__main__ import main as bench_main
from dataferry.course.cli import main

BAD_COUNTS = ["0", "-1", "nan", "abc", "", "1e30", "1000000000"]
BAD_AMOUNTS = ["-1", "nan", "inf", "abc", "", "1e30"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _cases(s: str, c: str, cache: str, f: str, mnt: str, state: str) -> list[list[str]]:
    """(s: a folder with files, c: a path that does not exist, cache: an existing cache, f: a file, mnt: a folder
    that is not a mount, state: a lab state folder that does not exist)"""
    cases: list[list[str]] = [[], ["nonsense"], ["stage"], ["stage", s], ["stage", "", "--cache", c],
                              ["stage", s, "--cache", ""], ["stage", f"{s}/missing", "--cache", c],
                              ["stage", "gs://", "--cache", c], ["stage", "gs://Bad Bucket!/x", "--cache", c],
                              ["stage", f, "--cache", c]]
    for option, values in (("--in-flight", BAD_COUNTS), ("--workers", BAD_COUNTS), ("--max-bytes", BAD_AMOUNTS),
                           ("--min-free-bytes", BAD_AMOUNTS), ("--rank", ["-1", "abc", "1", "nan"]),
                           ("--world-size", ["0", "-1", "abc", "1e30"])):
        cases += [["stage", s, "--cache", c, option, v] for v in values]
    for command in ("inspect", "verify", "prune", "clear"):
        extra = ["--max-bytes", "1"] if command == "prune" else []
        cases += [["cache", command, *extra], ["cache", command, "", *extra], ["cache", command, c, *extra],
                  ["cache", command, f, *extra]]
    cases += [["cache", "prune", cache, "--max-bytes", v] for v in BAD_AMOUNTS]
    cases += [["cache"], ["shards"], ["shards", "make"], ["shards", "make", s], ["shards", "make", "", c],
              ["shards", "make", s, ""], ["shards", "make", f"{s}/missing", c], ["shards", "make", s, f],
              ["shards", "make", "gs://", c], ["shards", "make", "gs://Bad Bucket!/x", c], ["shards", "make", mnt, c]]
    cases += [["shards", "make", s, c, "--shard-mb", v] for v in ["0", "-1", "1e30", "nan", "abc", "", "inf"]]
    cases += [["bench", ""], ["bench", s, "--lab"], ["bench", s, "--methods", ""], ["report"], ["report", ""],
              ["report", c]]
    for option, values in (("--passes", ["0", "-1", "nan", "1e30"]), ("--repeats", ["0", "-1", "abc"]),
                           ("--files", ["0", "-1", "1e30"]), ("--file-kib", ["0", "-5"]), ("--workers", ["-1", "nan"]),
                           ("--seed", ["abc", "nan"]), ("--out", [""]), ("--json", [""])):
        cases += [["bench", s, "--out", c, option, v] for v in values]
    for command, options in (("bench-cache", {"--repeats": ["0", "-1"], "--large-mib": ["0", "-1", "1e30"],
                                              "--peer-repeats": ["0"], "--peer-profiles": ["", "nowhere"],
                                              "--out": [""]}),
                             ("bench-shards", {"--samples": ["0", "-1"], "--sample-kib": ["0"],
                                               "--shard-mb": ["0", "nan", "-1"], "--budget-share": ["0", "2", "nan"],
                                               "--epochs": ["0"], "--repeats": ["0"], "--workers": ["-1"],
                                               "--batch": ["0"], "--out": [""]}),
                             ("bench-train", {"--images": ["0", "-1"], "--batch": ["0"], "--repeats": ["0"],
                                              "--plain-files": ["0", "-1"], "--out": [""]})):
        for option, values in options.items():
            cases += [[command, option, v] for v in values]
    lab = ["lab", "--state-dir", state]
    cases += [["lab"], ["lab", "--state-dir", "", "status"], [*lab, "up", "--port", "0"],
              [*lab, "up", "--port", "70000"], [*lab, "up", "--port", "abc"], [*lab, "up", "--profile", "nowhere"],
              [*lab, "profile", "nowhere"], [*lab, "mount"], [*lab, "unmount"], [*lab, "unmount", mnt],
              [*lab, "unmount", ""], [*lab, "dataset"], [*lab, "dataset", "b"]]
    for option, values in (("--files", ["0", "-1", "abc", "1e30"]), ("--size", ["-1", "abc", "nan"]),
                           ("--sigma", ["-1", "nan", "inf"]), ("--shard-mb", ["-1", "nan", "1e30", "inf"]),
                           ("--prefix", [""]), ("--seed", ["abc"])):
        base = {"--files": "10", "--size": "100"}
        base[option] = "x"
        args = [a for k, v in base.items() if k != option for a in (k, v)]
        cases += [[*lab, "dataset", "b", *args, option, v] for v in values]
    return cases


def test_every_bad_command_line_is_one_line_a_failing_status_and_changes_nothing(tmp_path, capsys, monkeypatch):
    s = tmp_path / "src"
    s.mkdir()
    (s / "a.bin").write_bytes(b"a" * 100)
    cache = tmp_path / "cache"
    subprocess.run([sys.executable, "-c", f"from dataferry import Cache; Cache({str(cache)!r}, min_free_bytes=0)"],
                   check=True)  # made and closed by a process that is gone: nothing writes to it later
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "mnt").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("DATAFERRY_LAB_STATE", str(tmp_path / "labstate"))
    import dataferry.harness.bench
    import benchmarks.cache
    import dataferry.course.lab.core
    import dataferry.course.lab.methodsbench
    import benchmarks.shards
    import benchmarks.train
    import dataferry.harness.utilisation

    class Ran(Exception):
        """A bad command line got as far as real work (a guard: the command should have refused it)."""

    def ran(*a, **k):
        raise Ran("it ran")

    for module, name in ((benchmarks.cache, "bench_cache"), (benchmarks.shards, "bench_shards"),
                         (benchmarks.train, "bench_train"), (dataferry.harness.bench, "bench_source"),
                         (dataferry.course.lab.methodsbench, "bench_lab"), (dataferry.course.lab.methodsbench, "bench_au_lab"),
                         (dataferry.harness.utilisation, "bench_au"), (dataferry.course.lab.core.Lab, "up"),
                         (dataferry.course.lab.core.Lab, "make_dataset"), (dataferry.course.lab.core.Lab, "mount")):
        monkeypatch.setattr(module, name, ran)
    before = _tree(tmp_path)
    failed = []
    for argv in _cases(str(s), str(tmp_path / "new"), str(cache), str(tmp_path / "afile"), str(tmp_path / "mnt"),
                       str(tmp_path / "state")):
        try:  # the benchmarks against peers: the repository's benchmarks/, not the package's command
            code = bench_main([argv[0].removeprefix("bench-"), *argv[1:]]) if argv[:1] and argv[0].startswith("bench-") \
                else main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # noqa: BLE001 - a traceback is a failure of this test
            failed.append(f"{argv}: raised {type(e).__name__}: {e}")
            continue
        out, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip()]
        problems = []
        if not isinstance(code, int) or code == 0:
            problems.append(f"exit {code!r}")
        if len(lines) != 1 or not lines[0].startswith("dataferry: error:"):
            problems.append(f"stderr {err!r}")
        if out.strip():
            problems.append(f"stdout {out[:200]!r}")
        after = _tree(tmp_path)
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))
            problems.append(f"changed {changed[:3]}")
            for name in set(after) - set(before):
                path = tmp_path / name
                if path.is_file():
                    path.unlink()
            for name in sorted(set(after) - set(before), reverse=True):
                if (tmp_path / name).is_dir():
                    (tmp_path / name).rmdir()
        if problems:
            failed.append(f"{argv}: {'; '.join(problems)}")
            before = _tree(tmp_path)
    assert not failed, f"{len(failed)} bad command lines misbehaved:\n" + "\n".join(failed)


def test_an_option_left_out_is_left_to_the_experiments_own_default(tmp_path, monkeypatch):
    """`dataferry bench` and `python -m benchmarks` pass on only the options given, by the experiment's names: a
    default lives in one place, the function a notebook calls too."""
    import benchmarks.cache
    import benchmarks.train
    import dataferry.course.lab.methodsbench
    import dataferry.harness.bench
    import dataferry.harness.utilisation

    calls = []
    for module, name in ((dataferry.harness.bench, "bench_source"), (dataferry.course.lab.methodsbench, "bench_lab"),
                         (dataferry.course.lab.methodsbench, "bench_au_lab"), (dataferry.harness.utilisation, "bench_au"),
                         (benchmarks.cache, "bench_cache"), (benchmarks.train, "bench_train")):
        monkeypatch.setattr(module, name, lambda *args, _name=name, **kwargs: calls.append((_name, args, kwargs)))
    folder = str(tmp_path)
    for argv, call in (
            (["bench", folder], ("bench_source", (folder,), {})),
            (["bench", folder, "--files", "3", "--json", f"{folder}/s.json"],
             ("bench_source", (folder,), {"max_files": 3, "json_path": f"{folder}/s.json"})),
            (["bench", "--lab"], ("bench_lab", (), {})),
            (["bench", "--lab", "--file-kib", "4", "--profiles", "colocated", "--passes", "3"],
             ("bench_lab", (), {"file_bytes": 4096, "profiles": ["colocated"], "passes": 3})),
            (["bench", "--lab", "--au", "resnet50-v100-amp", "--passes", "3"],
             ("bench_au_lab", (["resnet50-v100-amp"],), {"epochs": 3})),
            (["bench", folder, "--au", "resnet50-v100-amp", "--workers", "2"],
             ("bench_au", (["resnet50-v100-amp"], folder), {"workers": 2}))):
        calls.clear()
        assert main(argv) == 0, argv
        assert calls == [call], argv
    for argv, call in ((["cache"], ("bench_cache", (), {})),
                       (["cache", "--large-mib", "2", "--peer-profiles", "colocated"],
                        ("bench_cache", (), {"large_bytes": 2 << 20, "peer_profiles": ["colocated"]})),
                       (["train", "--compute", "resnet50-v100-amp", "--profile", "colocated"],
                        ("bench_train", (), {"profile": "resnet50-v100-amp", "region": "colocated"}))):
        calls.clear()
        assert bench_main(argv) == 0, argv
        assert calls == [call], argv
