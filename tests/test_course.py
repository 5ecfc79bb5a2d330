"""The course: lessons are well-formed, execute with papermill (and under nbval) against the lab,
and the book builds without warnings and shows every lesson with its figures in a real browser."""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REPO = tomllib.loads((ROOT / "helpers" / "pyproject.toml").read_text())["project"]["urls"]["Source"]
OWNER_REPO = REPO.removeprefix("https://github.com/")
EXPECTED = ["00_start_here", "01_google_drive", "02_gcsfuse", "03_gcs_client", "04_stage_to_local_disk",
            "05_budget_and_verify", "06_small_files_and_shards", "07_measure_by_region", "08_will_my_gpu_starve",
            "09_bigger_than_the_disk", "10_checkpoints", "11_analysis"]
COLAB_IMPORT = re.compile(r"^\s*(from\s+google\.colab\b|import\s+google\.colab\b|from\s+google\s+import\s+colab\b)", re.M)


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_all_twelve_lessons_exist_the_analysis_last():
    assert [p.stem for p in LESSONS] == EXPECTED


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_is_well_formed(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = nb["cells"]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, "outputs must be stripped"
    badge = f"https://colab.research.google.com/github/{OWNER_REPO}/blob/main/notebooks/{path.name}"
    assert cells[0]["cell_type"] == "markdown" and badge in _source(cells[0]), "badge must point at this file"
    assert "colab-badge.svg" in _source(cells[0])
    code = [c for c in cells if c["cell_type"] == "code"]
    setup = _source(code[0])
    assert 'if "google.colab" in sys.modules:' in setup, "the setup cell installs only in Colab"
    assert 'os.environ.get("DATAFERRY_INSTALL",' in setup and '%pip install -q "$requirement"' in setup, \
        "one override, $DATAFERRY_INSTALL, replaces the whole requirement"
    assert f'"dataferry @ git+{REPO}#subdirectory=helpers"' in setup, "the install URL is the package's Source URL"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and code[1] is tagged[0], "one parameters cell, right after the setup cell"
    params = _source(tagged[0])
    assert re.search(r'^WHERE = "auto" ', params, re.M), "WHERE decides, the same in every lesson"
    assert re.search(r'^RESULTS_DIR = ""', params, re.M) and re.search(r'^FIGURES_DIR = ""', params, re.M), \
        "results and figures default to the course folder, never to a path relative to the notebook"
    assert "LAB = True" not in params and "../" not in params
    assert re.search(r'^KEEP_ON_DRIVE = False ', params, re.M), "Drive is opt-in: the defaults need no sign-in"
    assert f'Course("{path.stem}", WHERE, RESULTS_DIR, FIGURES_DIR, keep_on_drive=KEEP_ON_DRIVE)' in _source(code[2]), \
        "the where cell follows"
    assert "course.finish()" in _source(code[-1]), "each lesson ends by keeping what it measured"
    for cell in code:
        assert not COLAB_IMPORT.search(_source(cell)), "google.colab is imported only inside the helpers"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_ends_with_the_pages_that_say_what_to_do(path):
    """A learner at the end of any lesson finds the decision page and the troubleshooting page, by links that
    work in Colab (on GitHub) and that point at pages the book has."""
    cells = json.loads(path.read_text())["cells"]
    assert all(cell.get("id") for cell in cells), f"{path.stem}: a cell without an id (nbformat 4.5 wants one)"
    last = cells[-1]
    assert last["cell_type"] == "markdown", path.stem
    for page in ("what_to_do", "troubleshooting"):
        assert f"{REPO}/blob/main/book/{page}.md" in _source(last), (path.stem, page)
        assert (ROOT / "book" / f"{page}.md").is_file() and f"file: {page}" in (ROOT / "book" / "_toc.yml").read_text()


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_measuring_lesson_defaults_to_at_least_five_repetitions(path):
    """The course's own rule: a median of fewer than 5 runs says little. Run time is kept in check by the
    size of the data, never by the number of repetitions."""
    params = next(_source(c) for c in json.loads(path.read_text())["cells"]
                  if "parameters" in c.get("metadata", {}).get("tags", []))
    repeats = re.search(r"^REPEATS = (\d+)", params, re.M)
    if repeats:
        assert int(repeats.group(1)) >= 5, f"{path.stem}: REPEATS = {repeats.group(1)}"


def test_install_url_badges_and_readme_agree():
    """The repository URL lives in pyproject.toml; the installed package, README and badges agree with it."""
    from dataferry.course import repository

    assert repository() == REPO
    readme = (ROOT / "README.md").read_text()
    assert f'pip install "dataferry @ git+{REPO}#subdirectory=helpers"' in readme
    badges = re.findall(r"https://colab\.research\.google\.com/github/([^)\s]+)", readme)
    assert len(badges) == len(LESSONS)
    for badge, path in zip(badges, LESSONS):
        assert badge == f"{OWNER_REPO}/blob/main/notebooks/{path.name}"


def test_google_colab_imported_only_inside_the_guarded_helpers():
    for py in (ROOT / "helpers" / "src").rglob("*.py"):
        for m in COLAB_IMPORT.finditer(py.read_text()):
            assert py.relative_to(ROOT / "helpers" / "src").as_posix() == "dataferry/mounts/colab.py", \
                f"{py}: imports google.colab"
            line = py.read_text()[m.start():].splitlines()[0]
            assert line.startswith("    "), f"{py}: google.colab must be imported inside a function"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The whole course with CI parameters, as `make course` runs it (lab, papermill, book)."""
    out = tmp_path_factory.mktemp("course")
    env = {**os.environ, "DATAFERRY_LAB_STATE": str(out / "lab-state")}
    env.pop("MPLBACKEND", None)  # the kernels' own inline backend embeds the figures
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "--ci", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (out / "course.log").write_text(proc.stdout + proc.stderr)
    return out, proc.stdout


def test_every_lesson_executes_under_ci_parameters(course):
    out, stdout = course
    for path in LESSONS:
        executed = json.loads((out / "notebooks" / path.name).read_text())
        errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: {errors[:1]}"
        assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")
        assert f"{path.stem} ..." in stdout, "progress names each lesson"
    assert "lab stopped" in stdout and "the book:" in stdout


def test_make_course_prints_no_kernel_warning_and_says_the_folders_were_passed_in(course):
    """`make course` passes every lesson its folders, so no lesson prints "(your home folder)"; its kernels
    talk over local sockets, so ipykernel has no TCP-without-encryption warning to print once a lesson."""
    out, _ = course
    assert "Kernel is running over TCP" not in (out / "course.log").read_text()
    for path in LESSONS:
        executed = (out / "notebooks" / path.name).read_text()
        assert "your home folder" not in executed and "both as passed in" in executed, path.name


def test_the_book_shows_no_folder_of_the_machine_that_built_it(course):
    """The book names the build folder `build/` and the temporary folder `/tmp/`, not where they were."""
    out, _ = course
    html = out / "book" / "_build" / "html" / "notebooks"
    machine = [str(out), str(ROOT), tempfile.gettempdir()]
    for path in LESSONS:
        page = (html / f"{path.stem}.html").read_text()
        assert not [m for m in machine if m in page and m != "/tmp"], path.stem
    executed = (out / "notebooks" / "00_start_here.ipynb").read_text()
    assert str(out) in executed, "the executed notebooks keep the real folders; only the book names them"


# A number in prose: digits not glued to a word ("CRC32C", "l04"), with an optional decimal part.
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]\w)")
# Numbers that name something rather than state a result: "lesson 06", "epoch 1", "pass 2", "the 2020 post".
NAMING = re.compile(r"\b(?:lessons?|epochs?|pass(?:es)?|steps?|sections?|cells?|issues?)\s+\d+(?:\s*(?:-|and|to)\s*\d+)?"
                    r"|\b(?:19|20)\d\d\b(?=\s+(?:post|method|blog))", re.I)
HEADING = re.compile(r"^#+\s+(.*)$", re.M)


def unbacked_conclusion_numbers(notebook: dict) -> list[str]:
    """Numbers that a markdown cell under a "Conclusion" heading states and no output of the run printed.

    A conclusion is the markdown from a heading that starts with "Conclusion" to the next heading; its
    numbers must come from the run (an output's text), or be names (lesson 06, epoch 1, the 2020 post).
    """
    printed = " ".join(_output_text(o) for c in notebook["cells"] for o in c.get("outputs", []))
    printed_numbers = set(NUMBER.findall(printed))
    missing, inside = [], False
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = _source(cell)
        headings = HEADING.findall(text)
        if headings:
            inside = headings[-1].strip().lower().startswith("conclusion")
        if inside:
            prose = NAMING.sub(" ", HEADING.sub(" ", text))
            missing += [n for n in NUMBER.findall(prose) if n not in printed_numbers]
    return missing


def _output_text(output: dict) -> str:
    if "text" in output:
        return _source({"source": output["text"]})
    data = output.get("data", {})
    return " ".join(_source({"source": data[k]}) for k in ("text/plain", "text/markdown", "text/html") if k in data)


def conclusion_printout(notebook: dict) -> str:
    """What the code cells of the "Conclusion" section printed: the conclusion computed from the run."""
    printed, inside = [], False
    for cell in notebook["cells"]:
        headings = HEADING.findall(_source(cell)) if cell["cell_type"] == "markdown" else []
        if headings:
            inside = headings[-1].strip().lower().startswith("conclusion")
        elif inside and cell["cell_type"] == "code":
            printed += [_output_text(o) for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
    return "".join(printed).strip()


def test_the_conclusion_check_flags_a_number_the_run_did_not_print():
    def nb(conclusion, printed):
        return {"cells": [
            {"cell_type": "markdown", "source": "## Method\nWe read 96 files."},
            {"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "text": [printed]}]},
            {"cell_type": "markdown", "source": conclusion},
        ]}

    assert unbacked_conclusion_numbers(nb("## Conclusion\nEpoch 2 ran at local-disk speed, 612 MB/s.",
                                          "epoch 2: 612 MB/s\n")) == []
    assert unbacked_conclusion_numbers(nb("## Conclusion\nLater epochs ran at 700 MB/s, 3.5x faster.",
                                          "epoch 2: 612 MB/s\n")) == ["700", "3.5"]
    assert unbacked_conclusion_numbers(nb("## Conclusion\nSee lesson 06 and the 2020 post; CRC32C checks.",
                                          "")) == []
    assert unbacked_conclusion_numbers(nb("## Next\nThe 96 files were 7 MB.", "")) == [], "only conclusions"
    assert conclusion_printout(nb("## Conclusion", "x")) == "", "the printout comes from cells under the heading"
    computed = nb("## Conclusion", "")
    computed["cells"].append({"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "text": "ok"}]})
    assert conclusion_printout(computed) == "ok"


def test_conclusions_are_printed_by_the_run_and_state_no_number_it_did_not_print(course):
    out, _ = course
    for path in LESSONS:
        executed = json.loads((out / "notebooks" / path.name).read_text())
        assert unbacked_conclusion_numbers(executed) == [], f"{path.name}: a conclusion states numbers the run did not print"
        if path.stem != "00_start_here":  # the tour measures one file; its conclusion is computed too
            assert len(conclusion_printout(executed)) > 80, f"{path.name}: the conclusion is not computed from the run"


def test_no_figure_of_the_course_pools_regions_file_sizes_or_lessons(course):
    """Every box of every figure the lessons drew through dataferry.harness.plots holds one region, one file
    size and (where the rows name it) one lesson; the standard figures of lessons 07 and 11 are among them."""
    from dataferry.harness.plots import box_provenance

    out, _ = course
    checked = {}
    for png in sorted((out / "ci-figures").glob("*.png")):
        boxes = box_provenance(png)
        if boxes is None:
            continue
        checked[png.stem] = len(boxes)
        for box in boxes:
            assert len(box["regions"]) <= 1 and len(box["sizes"]) <= 1 and len(box["lessons"]) <= 1, (png.name, box)
    assert {"07_by_region", "11_first_vs_repeat", "11_by_region", "11_per_epoch"} <= set(checked), checked
    assert checked["11_first_vs_repeat"] > 0


def test_the_results_page_says_what_lesson_11_concluded(course):
    out, _ = course
    executed = json.loads((out / "notebooks" / "11_analysis.ipynb").read_text())
    said = conclusion_printout(executed).splitlines()[0]
    page = (out / "book" / "_build" / "html" / "results.html").read_text()
    assert "What the pooled runs show" in page
    assert said.split(":")[0] in re.sub(r"<[^>]+>", "", page), "the page quotes lesson 11's computed conclusion"


def test_book_pages_load_with_their_figures_in_chromium(course):
    out, _ = course
    html = out / "book" / "_build" / "html"
    pages = [html / "intro.html", html / "method.html", html / "results.html", html / "what_to_do.html",
             html / "troubleshooting.html"] + \
            [html / "notebooks" / f"{p.stem}.html" for p in LESSONS]
    for page in pages:
        assert page.exists(), page
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            page = browser.new_page()
            for path in pages:
                page.goto(path.as_uri())
                page.wait_for_load_state("load")
                images = page.eval_on_selector_all("img", "els => els.map(e => [e.currentSrc, e.complete, e.naturalWidth])")
                # Remote images (the Colab badge) cannot load on a machine without internet; every
                # image the book itself ships must.
                broken = [src for src, complete, width in images
                          if src.startswith("file://") and (not complete or width == 0)]
                assert not broken, f"{path.name}: broken images {broken}"
                if path.parent.name == "notebooks" or path.name == "results.html":
                    assert any(w > 0 for src, _, w in images if "_images" in src or "figures" in src), \
                        f"{path.name}: no figure"
                clipped = page.eval_on_selector_all(
                    "div.cell_output pre, table", "els => els.filter(e => e.scrollWidth > e.clientWidth + 2).length")
                assert clipped == 0, f"{path.name}: {clipped} printed outputs or tables cut off on the right"
                # a table wider than its output cell is cut off by the cell, whatever its own scroll width
                too_wide = page.eval_on_selector_all("div.cell_output table", "els => els.filter(e => "
                                                     "e.getBoundingClientRect().right > e.closest('div.cell_output')"
                                                     ".getBoundingClientRect().right + 2).length")
                assert too_wide == 0, f"{path.name}: {too_wide} tables wider than their output cell"
                links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
                for href in links:
                    if href.startswith("file://"):
                        target = Path(href.removeprefix("file://").split("#")[0].split("?")[0])
                        assert target.exists(), f"{path.name}: link to missing {target}"
        finally:
            browser.close()


def test_lessons_run_under_nbval(tmp_path):
    """`pytest --nbval-lax` on the lessons, after `papermill --prepare-only` injects the CI parameters."""
    from dataferry.course.lab import Lab

    sys.path.insert(0, str(ROOT / "scripts"))
    from course import parameters_for

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    for path in LESSONS:
        params = parameters_for(path, True, tmp_path)
        args = [x for k, v in params.items() for x in ("-p", k, str(v))]
        subprocess.run([str(Path(sys.executable).parent / "papermill"), "--prepare-only", str(path),
                        str(prepared / path.name), *args], check=True, capture_output=True, timeout=120)
    lab = Lab(state_dir=tmp_path / "lab-state").up()
    try:
        env = {**os.environ, "DATAFERRY_LAB_STATE": str(tmp_path / "lab-state"), "TQDM_DISABLE": "1"}
        env.pop("MPLBACKEND", None)
        proc = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                               "-o", "testpaths=", *map(str, sorted(prepared.glob("*.ipynb")))],
                              cwd=ROOT / "notebooks", capture_output=True, text=True, timeout=1200, env=env)
    finally:
        lab.down()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert re.search(r"\d+ passed", proc.stdout) and "failed" not in proc.stdout.splitlines()[-1]
