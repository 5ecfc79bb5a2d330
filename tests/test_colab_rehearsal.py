"""The Colab rehearsal (scripts/colab_rehearsal.py): every lesson runs from its badge's defaults the
way Colab runs it (Colab's package versions, the setup cell's real install, no Go, the public data
reached only through STORAGE_EMULATOR_HOST), and it fails, naming the lesson and the cell, when a
lesson's Colab defaults need the lab or when pip touches a preinstalled package."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "colab_rehearsal.py"
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _rehearse(out: Path, *notebooks: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *notebooks, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=2400)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return proc, report


def _edited_copy(lesson: str, folder: Path, name: str, cell: int, old: str, new: str) -> Path:
    nb = json.loads((ROOT / "notebooks" / f"{lesson}.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    source = "".join(code[cell]["source"])
    assert old in source
    code[cell]["source"] = source.replace(old, new)
    path = folder / f"{name}.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.timeout(2400)  # every lesson at its Colab defaults (lesson 04 trains a CNN), as long as _rehearse allows
def test_every_lesson_runs_with_its_colab_defaults(tmp_path):
    proc, report = _rehearse(tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert f"{len(LESSONS)} passed, 0 failed" in proc.stdout
    lessons = {r["lesson"]: r for r in report["lessons"]}
    assert list(lessons) == [p.stem for p in LESSONS]
    for name, r in lessons.items():
        assert r["problems"] == [], name
        assert any(f.startswith("results/") for f in r["results"]), f"{name} wrote results into the course folder"
        asks_for_drive = ["drive.mount"] if name == "01_google_drive" else []  # the lesson that measures Drive
        assert [c["call"] for c in r["colab_calls"]] == [*asks_for_drive, "files.download"], \
            f"{name}: no Drive but where Drive is measured, no sign-in, one zip"
        if name not in ("00_start_here", "10_checkpoints"):  # 00 reads files it writes; 10 saves to the runtime's disk
            assert r["reads"]["cloud-samples-data"]["files"] > 0, f"{name} read the public images"
    executed = json.loads((tmp_path / "01_google_drive.ipynb").read_text())
    said = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "Drive was not measured: mounting it failed (mount failed: access refused" in said, "a refusal is said, and a stand-in measured"
    assert "a stand-in for Drive, not Drive" in said
    assert lessons["06_small_files_and_shards"]["reads"]["gcp-public-data-landsat"]["files"] > 0
    assert "Python 3.13" in report["python"]


def test_a_lesson_needing_the_lab_or_touching_colabs_packages_fails_by_name(tmp_path):
    needs_lab = _edited_copy("03_gcs_client", tmp_path, "03_needs_lab", 1, 'WHERE = "auto"', 'WHERE = "lab"')
    pins = _edited_copy("00_start_here", tmp_path, "00_pins_tqdm", 0, '%pip install -q "$requirement"',
                        '%pip install -q "$requirement" "tqdm==4.66.6"')
    proc, report = _rehearse(tmp_path / "out", str(needs_lab), str(pins))
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "0 passed, 2 failed: 03_needs_lab, 00_pins_tqdm" in proc.stdout
    lab_problems, pip_problems = (r["problems"] for r in report["lessons"])
    assert re.search(r"cell \d+ \('from dataferry.course import Course, show_table'\): \w+: .*\bGo\b",
                     lab_problems[0]), lab_problems
    assert re.search(r"FAILED: cell \d+ \('from dataferry.course import Course, show_table'\)", proc.stdout), \
        "the output names the cell"
    assert any("pip changed preinstalled packages: {'tqdm': '4.67.3 -> 4.66.6'}" in p for p in pip_problems), pip_problems
    after = subprocess.run([str(ROOT / "build" / "colab" / "venv" / "bin" / "python"), "-m", "pip", "show", "tqdm"],
                           capture_output=True, text=True).stdout
    assert "Version: 4.67.3" in after, "the rehearsal put Colab's version back"
