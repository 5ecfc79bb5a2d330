"""Run the course: start the lab, execute every lesson with papermill, build the book, stop the lab.

    python scripts/course.py              # what `make course` runs
    python scripts/course.py --ci         # small parameters (what the tests run), figures kept out of figures/

Executed notebooks go to build/notebooks/, result CSVs to build/results/, figures to figures/
(or, with --ci, to build/ci-figures/), the book to build/book/html/index.html.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI_PARAMETERS = {"N_FILES": 6, "TEST_FILES": 10, "DECODE_FILES": 50, "FILE_BYTES": 262144, "REPEATS": 1, "EPOCHS": 2}


def lessons() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def parameters_for(notebook: Path, ci: bool, out: Path) -> dict:
    """The values papermill injects: where results and figures go (the lessons' own default is the
    learner's course folder), and in CI the small sizes (only those the lesson's parameters cell declares)."""
    import papermill

    declared = {p for p in papermill.inspect_notebook(str(notebook))}
    params = {"RESULTS_DIR": str(out / "results"), "FIGURES_DIR": str(out / "ci-figures" if ci else ROOT / "figures")}
    if ci:
        params.update(CI_PARAMETERS)
    return {k: v for k, v in params.items() if k in declared}


def hide_injected_cell(executed: Path) -> None:
    """Tag papermill's injected-parameters cell ``remove-cell``: the book shows the lesson as a learner sees it."""
    nb = json.loads(executed.read_text())
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
    executed.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _ipc_kernel_manager() -> type:
    """A kernel manager whose kernel talks over local sockets (IPC) rather than TCP on loopback: nothing
    listens on a port, and ipykernel has no "running over TCP without encryption" warning to print."""
    import tempfile

    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        transport = "ipc"
        ip = str(Path(tempfile.gettempdir()) / f"dataferry-kernel-{os.getpid()}")  # socket files, removed at the end

    return IPCKernelManager


def execute(out: Path, ci: bool, only: list[str] | None = None) -> list[Path]:
    import papermill

    done = []
    todo = [nb for nb in lessons() if not only or any(nb.name.startswith(o) for o in only)]
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    for i, nb in enumerate(todo, 1):
        target = out / "notebooks" / nb.name
        print(f"[{i}/{len(todo)}] {nb.stem} ...", end=" ", flush=True)
        t0 = time.monotonic()
        papermill.execute_notebook(str(nb), str(target), parameters=parameters_for(nb, ci, out),
                                   cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False,
                                   kernel_manager_class=_ipc_kernel_manager())
        hide_injected_cell(target)
        print(f"{time.monotonic() - t0:.0f} s", flush=True)
        done.append(target)
    return done


def pooled_conclusion(executed: Path) -> str:
    """What lesson 11's conclusion cell printed, as markdown: the Results page says it in words."""
    if not executed.exists():
        return ""
    cells = json.loads(executed.read_text())["cells"]
    printed = "".join("".join(o["text"]) for c in cells if c.get("id") == "l07-17c"
                      for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stdout")
    return printed.strip()


def without_build_paths(text: str, out: Path) -> str:
    """An executed notebook as the book shows it: the folders of the machine that built it named for what they
    are (``build/``: the build folder; ``/tmp/``: the system's temporary folder), not by where they were on it."""
    for path, shown in ((out, "build"), (ROOT, "."), (Path(tempfile.gettempdir()), "/tmp")):
        text = text.replace(json.dumps(str(path.absolute()))[1:-1], shown)
    return text


def build_book(out: Path) -> Path:
    """Copy book/ and the executed lessons into one source folder and build it (warnings are errors).

    The Results page gets lesson 11's computed conclusion, word for word, above the figures."""
    src = out / "book-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "book", src)
    shutil.copytree(out / "notebooks", src / "notebooks")
    for executed in (src / "notebooks").glob("*.ipynb"):
        executed.write_text(without_build_paths(executed.read_text(), out))
    said = pooled_conclusion(out / "notebooks" / "11_analysis.ipynb")
    if said:
        results = src / "results.md"
        text = results.read_text()
        heading = "## First read vs repeated reads, by method"
        results.write_text(text.replace(heading, "## What the pooled runs show\n\nLesson 11 computed this from the "
                                        "pooled rows when the course was built; it is its output, word for word:\n\n"
                                        f"{said}\n\n{heading}", 1))
    figures = out / "ci-figures" if (out / "ci-figures").exists() else ROOT / "figures"
    shutil.copytree(figures, src / "figures", dirs_exist_ok=True)
    html = out / "book"
    shutil.rmtree(html, ignore_errors=True)
    subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(src), "--path-output", str(html),
                    "-W", "-n", "--keep-going", "-q"], check=True)
    return html / "_build" / "html" / "index.html"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ci", action="store_true", help="small parameters; figures to build/ci-figures")
    parser.add_argument("--out", default=str(ROOT / "build"), help="build folder")
    parser.add_argument("--only", nargs="*", help="lesson numbers to run, e.g. 00 03")
    parser.add_argument("--no-book", action="store_true")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    os.environ.setdefault("DATAFERRY_LAB_STATE", str(out / "lab-state"))
    os.environ.pop("MPLBACKEND", None)  # let each kernel use its inline backend, so figures are embedded
    # Progress bars are for someone watching; in an executed notebook every redraw would stay behind as a
    # stderr chunk. tqdm (>= 4.66) reads TQDM_* variables as defaults for its arguments.
    os.environ.setdefault("TQDM_DISABLE", "1")
    from dataferry.course.lab import Lab

    t0 = time.monotonic()
    lab = Lab()
    print(f"starting the lab ({lab.state_dir}) ...", flush=True)
    lab.up()
    try:
        execute(out, args.ci, args.only)
    finally:
        lab.down()
        print("lab stopped", flush=True)
    if not args.no_book:
        print("building the book ...", flush=True)
        index = build_book(out)
        print(f"the book: {index}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
