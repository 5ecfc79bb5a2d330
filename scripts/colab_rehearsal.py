"""The Colab rehearsal: every lesson executed the way Colab executes it, offline.

    python scripts/colab_rehearsal.py setup            # the Colab-like virtual environment (make colab-venv)
    python scripts/colab_rehearsal.py                  # every lesson (make colab-rehearsal)
    python scripts/colab_rehearsal.py 02 path/x.ipynb  # some lessons, or any notebook

What Colab does and this does the same way:
- a Python environment with Colab's preinstalled versions (scripts/colab/pip-freeze.txt) of every package
  the course touches, and no papermill, nbval, jupyter-book, Go or lab tools;
- the notebook opened alone in an empty /content-like folder, its kernel in that environment, with
  ``google.colab`` importable and imported at start (a stand-in: the one thing that cannot run here;
  it records drive.mount, auth and download calls, and refuses access to Drive);
- the setup cell's real ``%pip install``, pointed at this checkout by ``$DATAFERRY_INSTALL``; pip must
  reinstall, upgrade or downgrade none of the preinstalled packages;
- the lesson's Colab defaults (nothing injected), so ``WHERE = "auto"`` picks the public data set;
- the "public buckets" served by a lab started here, outside the notebook, with the public data sets'
  object layout and sizes, reached only through ``STORAGE_EMULATOR_HOST``. gcsfuse is on PATH as
  Colab's apt install would leave it (the apt step itself needs Google's package server).

A lesson fails the rehearsal, naming the lesson and the cell, when it raises, needs Go or a lab tool,
mounts Drive (but for a lesson that measures Drive), signs in, reads a bucket other than the public ones, writes outside the course folder,
prints a warning, or when pip touched a preinstalled package. Executed notebooks and report.json go to
build/colab-rehearsal/.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FREEZE = ROOT / "scripts" / "colab" / "pip-freeze.txt"
VENV = ROOT / "build" / "colab" / "venv"
OUT = ROOT / "build" / "colab-rehearsal"
# What the course touches in Colab: the package's dependencies, the [torch] and [plots] extras, the kernel.
ROOTS = ["pip", "setuptools", "wheel", "google-cloud-storage", "google-api-core", "google-crc32c", "requests",
         "filelock", "tqdm", "torch", "torchvision", "numpy", "pandas", "matplotlib", "seaborn", "tabulate", "ipykernel", "ipython"]
# The lessons whose Colab defaults mount Drive, because Drive is what they measure: the rehearsal's Drive
# refuses access, as a learner who declines does, and they must go on with a stand-in that says so.
MEASURES_DRIVE = {"01_google_drive"}
# Colab's CPU image has no CUDA libraries; PyPI's torch brings its own, so none is pinned from the snapshot.
UNPINNED = re.compile(r"^(nvidia-|triton)")


# -- the Colab-like environment ------------------------------------------------------------------

def colab_python() -> tuple[str, str]:
    """The Python nearest Colab's 3.13: a working python3.13 (PATH, then pyenv's), else this one."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [shutil.which("python3.13")] + sorted(glob.glob(f"{root}/versions/3.13*/bin/python3.13"), reverse=True)
    for exe in filter(None, candidates):
        if subprocess.run([exe, "-c", "import venv"], capture_output=True).returncode == 0:
            return exe, "Python 3.13, as Colab"
    return sys.executable, f"Python {sys.version.split()[0]}: no Python 3.13 here, the nearest is this one"


def setup() -> Path:
    """Make (or keep) the Colab-like venv; a stamp records the snapshot it was made from."""
    stamp = VENV / ".colab-snapshot"
    digest = hashlib.sha256(FREEZE.read_bytes() + " ".join(ROOTS).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return VENV
    python, why = colab_python()
    print(f"making the Colab-like environment in {VENV} ({why})", flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    constraints = VENV / "constraints.txt"
    constraints.write_text("".join(line + "\n" for line in FREEZE.read_text().splitlines()
                                   if line and not line.startswith("#") and not UNPINNED.match(line)))
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints)]
    subprocess.run(pip + ["pip"], check=True)
    subprocess.run(pip + ROOTS, check=True)
    stamp.write_text(digest)
    return VENV


def freeze(venv: Path) -> dict[str, str]:
    """``{name: "version@mtime"}`` of every installed distribution: a reinstall of the same version
    rewrites its RECORD, so it shows as a change too."""
    out = {}
    for record in glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "*.dist-info" / "RECORD")):
        meta = Path(record).with_name("METADATA").read_text(errors="replace")
        fields = dict(line.split(": ", 1) for line in meta.splitlines()[:20] if ": " in line)
        name = re.sub(r"[-_.]+", "-", fields.get("Name", "?")).lower()
        out[name] = f"{fields.get('Version', '?')}@{os.stat(record).st_mtime_ns}"
    return out


# -- the public buckets, played by the lab ---------------------------------------------------------

def flower_photos(prefix: str) -> dict[str, bytes]:
    """The lab's stand-in for the public flowers: as many real JPEGs per class as the public set has
    (dataferry.course.lab.flowers), drawn once and kept under build/colab/ for the next rehearsal."""
    import PIL

    from dataferry.course.lab.flowers import PUBLIC_COUNTS, VERSION, plan_flowers

    planned = plan_flowers(PUBLIC_COUNTS, seed=2026, prefix=prefix)
    kept = VENV.parent / f"flowers-2026-v{VERSION}-pillow{PIL.__version__}"
    if kept.is_dir():
        return {name: (kept / name).read_bytes() for name in planned.object_names}
    print(f"drawing {len(planned.object_names)} flower JPEGs (once, kept in {kept}) ...", flush=True)
    drawing = kept.with_name(kept.name + ".partial")
    shutil.rmtree(drawing, ignore_errors=True)
    planned.write_to(drawing)
    os.replace(drawing, kept)  # whole or not there: an interrupted drawing is never served
    return dict(planned.objects())


def serve_public_data(lab) -> dict[str, dict[str, int]]:
    """Upload stand-ins for the public data sets: the same names, folders and sizes; flowers that are
    real JPEGs of five learnable classes, Landsat bands of random bytes."""
    from dataferry.course import PUBLIC_DATASETS
    from dataferry.course.lab.datasets import sample_bytes
    from dataferry.course.shipped import public_manifest

    flowers, landsat = PUBLIC_DATASETS["flowers"], PUBLIC_DATASETS["landsat-scene"]
    photos = flower_photos(flowers.prefix)
    objects: dict[str, dict[str, int]] = {flowers.bucket: {n: len(d) for n, d in photos.items()}, landsat.bucket: {}}
    labels = [f"gs://{flowers.bucket}/{name},{name[len(flowers.prefix):].split('/')[0]}\n" for name in photos]
    csv = "".join(labels).encode()
    scene = landsat.prefix.rstrip("/").rsplit("/", 1)[-1]
    for key, size in public_manifest("landsat-scene")["object_bytes"].items():  # the sizes data/public/ records
        objects[landsat.bucket][f"{landsat.prefix}{scene}_{key}" + ("" if "." in key else landsat.suffix)] = size
    client = lab.client(direct=True)
    for bucket in objects:
        lab.create_bucket(bucket)

    def put(item):
        bucket, name, size = item
        data = photos[name] if bucket == flowers.bucket else sample_bytes(0, name, size)
        client.bucket(bucket).blob(name).upload_from_string(data)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, [(b, n, s) for b, names in objects.items() for n, s in names.items()]))
    client.bucket(flowers.bucket).blob(f"{flowers.prefix}flowers.csv").upload_from_string(csv)
    objects[flowers.bucket][f"{flowers.prefix}flowers.csv"] = len(csv)
    return objects


_READ = [re.compile(r"^/(?:download/)?storage/v1/b/(?P<bucket>[^/?]+)/o/(?P<object>[^?]+)\?(?:.*&)?alt=media"),
         re.compile(r"^/(?P<bucket>[^/?]+)/(?P<object>[^?]+)")]  # the XML API, which gcsfuse reads through
_ANY_BUCKET = re.compile(r"^/(?:(?:download/|upload/)?storage/v1/b/)?(?P<bucket>[a-z0-9][a-z0-9._-]+)(?:/|\?|$)")


def reads_since(lab, start: int, sizes: dict[str, dict[str, int]]) -> tuple[dict, set[str]]:
    """What the lesson read from each bucket since request ``start``: files and bytes; and every bucket named."""
    from urllib.parse import unquote

    read: dict[str, set[str]] = {}
    buckets: set[str] = set()
    for method, path, status in lab.requests()[start:]:
        m = _ANY_BUCKET.match(path)
        if m and m["bucket"] not in ("storage", "download", "upload", "_internal"):
            buckets.add(m["bucket"])
        for pattern in _READ:
            hit = pattern.match(path)
            if method == "GET" and hit and status < 300 and hit["bucket"] in sizes:
                name = unquote(hit["object"])
                if name in sizes[hit["bucket"]]:
                    read.setdefault(hit["bucket"], set()).add(name)
                break
    summary = {b: {"files": len(n), "bytes": sum(sizes[b][x] for x in n),
                   "prefixes": sorted({x.rsplit("/", 2)[0] + "/" for x in n})[:3]} for b, n in read.items()}
    return summary, buckets


# -- one lesson, as Colab runs it ------------------------------------------------------------------

STANDIN = '''"""A stand-in for google.colab (the Colab rehearsal): the only part of Colab that cannot run here."""
import json, os


def _record(call, **args):
    with open(os.environ["COLAB_REHEARSAL_CALLS"], "a") as f:
        f.write(json.dumps({"call": call, **args}) + "\\n")
'''
STANDIN_MODULES = {
    "drive": "from google.colab import _record\n\n\ndef mount(mountpoint, force_remount=False, timeout_ms=120000, "
             "readonly=False):\n    _record('drive.mount', mountpoint=mountpoint, readonly=readonly)\n"
             "    raise ValueError('mount failed: access refused (the Colab rehearsal has no Drive)')\n\n\n"
             "def flush_and_unmount(*a, **k):\n    pass\n",
    "auth": "from google.colab import _record\n\n\ndef authenticate_user(*args, **kwargs):\n"
            "    _record('auth.authenticate_user')\n",
    "files": "from google.colab import _record\n\n\ndef download(filename):\n"
             "    _record('files.download', filename=str(filename))\n",
}


def _sandbox(top: Path, nb: Path, endpoint: str) -> dict[str, str]:
    """The folders and environment of one Colab runtime under ``top``; returns the kernel's environment."""
    content = top / "content"
    content.mkdir()
    shutil.copy(nb, content / nb.name)
    pkg = top / "standin" / "google" / "colab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STANDIN)
    for name, text in STANDIN_MODULES.items():
        (pkg / f"{name}.py").write_text(text)
    startup = top / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # Colab's kernel imports it at start\n")
    kernel = top / "jupyter" / "kernels" / "colab"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(VENV / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab rehearsal", "language": "python"}))
    apt_bin = top / "apt-bin"  # where Colab's `apt-get install gcsfuse` would have put it
    apt_bin.mkdir()
    gcsfuse = sorted(glob.glob(str(Path(os.environ.get("DATAFERRY_TOOLS", ROOT / "build" / "tools")) / "gcsfuse-*")))
    if gcsfuse:
        (apt_bin / "gcsfuse").symlink_to(gcsfuse[-1])
    (top / "root").mkdir()
    (top / "no-tools").mkdir()
    (top / "tmp").mkdir()  # the runtime's /tmp, on the same disk as /content in Colab
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAFERRY", "STORAGE_EMULATOR", "GO", "MPL",
                                                                    "JUPYTER", "IPYTHON", "PYTHON", "VIRTUAL_ENV"))}
    env.update({
        "PATH": os.pathsep.join([str(VENV / "bin"), str(apt_bin), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
        "HOME": str(top / "root"), "TMPDIR": str(top / "tmp"), "PYTHONPATH": str(top / "standin"), "IPYTHONDIR": str(top / "ipython"),
        "JUPYTER_PATH": str(top / "jupyter"), "COLAB_RELEASE_TAG": "rehearsal",
        "COLAB_REHEARSAL_CALLS": str(top / "colab-calls.jsonl"),
        "STORAGE_EMULATOR_HOST": endpoint,
        "DATAFERRY_INSTALL": f"dataferry @ file://{ROOT / 'helpers'}",
        "DATAFERRY_TOOLS": str(top / "no-tools"), "DATAFERRY_LAB_STATE": str(top / "root" / "lab-state"),
        "DATAFERRY_HOME": str(content / "dataferry"),
    })
    return env


def _failed_cell(executed: Path) -> str:
    """'cell N (first line of its source): ErrorName: message' for the first cell that raised."""
    if not executed.exists():
        return "the notebook did not start"
    cells = json.loads(executed.read_text())["cells"]
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first = next((line for line in "".join(cell["source"]).splitlines() if line.strip()
                              and not line.startswith("#")), "")
                return f"cell {i} ({first.strip()[:70]!r}): {out['ename']}: {out['evalue'][:400]}"
    return "no cell raised"


def _warnings(executed: Path) -> list[str]:
    """Warnings a learner would see in the executed notebook's output (progress bars are not warnings)."""
    found = []
    if executed.exists():
        for i, cell in enumerate(json.loads(executed.read_text())["cells"]):
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", [])) if out.get("name") == "stderr" else ""
                found += [f"cell {i}: {line.strip()[:200]}" for line in text.splitlines() if "Warning" in line]
    return found


def _stray_files(top: Path, nb: Path) -> list[str]:
    """Files the lesson wrote outside the course folder (content/dataferry) and the runtime's own places."""
    allowed = {"standin", "ipython", "jupyter", "apt-bin", "root", "no-tools", "tmp", "colab-calls.jsonl"}
    stray = [str(p.relative_to(top)) for p in top.iterdir() if p.name not in allowed and p.name != "content"]
    stray += [str(p.relative_to(top)) for p in (top / "content").iterdir() if p.name not in (nb.name, "dataferry")]
    stray += [str(p.relative_to(top)) for p in (top / "no-tools").rglob("*")]
    # what outlives the kernel in /tmp fills the runtime's disk, run after run (multiprocessing's and
    # torch's own folders are theirs)
    stray += [str(p.relative_to(top)) for p in (top / "tmp").iterdir()
              if not p.name.startswith(("pymp-", "torchinductor_", "torchelastic_"))]
    return stray


def touched(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """What pip did to the packages that were installed before: upgraded, downgraded, reinstalled, removed."""
    out = {}
    for name, was in before.items():
        now = after.get(name)
        if now != was:
            old, new = was.split("@")[0], (now or "@").split("@")[0]
            out[name] = "removed" if now is None else f"{old} reinstalled" if old == new else f"{old} -> {new}"
    return out


def restore(venv: Path, before: dict[str, str], after: dict[str, str]) -> None:
    """Put back the preinstalled versions a lesson's pip changed, so the next lesson starts as Colab would."""
    back = [f"{name}=={pinned.split('@')[0]}" for name, pinned in before.items() if after.get(name) != pinned]
    if back:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", *back], check=True)


def rehearse(nb: Path, lab, sizes: dict[str, dict[str, int]], out: Path) -> dict:
    """Run one notebook as Colab would; return its report (``problems`` empty when it passed)."""
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "dataferry"],
                   capture_output=True)  # a fresh runtime has no dataferry: the setup cell installs it
    before = freeze(VENV)
    top = Path(tempfile.mkdtemp(prefix="colab-rehearsal-"))
    executed = out / nb.name
    report = {"lesson": nb.stem, "problems": []}
    try:
        env = _sandbox(top, nb, lab.endpoint)
        start = len(lab.requests())
        t0 = time.monotonic()
        proc = subprocess.run([str(Path(sys.executable).parent / "papermill"), str(top / "content" / nb.name),
                               str(executed), "-k", "colab", "--cwd", str(top / "content"), "--no-progress-bar",
                               "--log-level", "ERROR"], env=env, capture_output=True, text=True, timeout=1500)
        report["seconds"] = round(time.monotonic() - t0, 1)
        if proc.returncode != 0:
            report["problems"].append(f"{_failed_cell(executed)}")
            if not executed.exists():
                report["problems"].append(proc.stderr[-2000:])
        warned = _warnings(executed)
        if warned:
            report["problems"].append(f"printed warnings: {warned[:3]}")
        report["reads"], buckets = reads_since(lab, start, sizes)
        others = sorted(buckets - set(sizes))
        if others:
            report["problems"].append(f"read buckets other than the public ones: {others}")
        calls = [json.loads(line) for line in (top / "colab-calls.jsonl").read_text().splitlines()] \
            if (top / "colab-calls.jsonl").exists() else []
        report["colab_calls"] = calls
        for call in calls:
            if call["call"] == "auth.authenticate_user" or (call["call"] == "drive.mount" and nb.stem not in MEASURES_DRIVE):
                report["problems"].append(f"the Colab defaults called {call['call']}: they must need no Drive "
                                          "and no sign-in")
        stray = _stray_files(top, nb)
        if stray:
            report["problems"].append(f"wrote outside the course folder: {stray[:5]}")
        home = top / "content" / "dataferry"
        report["results"] = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) \
            if home.exists() else []
        after = freeze(VENV)
        changed = touched(before, after)
        report["added"] = sorted(set(after) - set(before) - {"dataferry"})
        if changed:
            report["problems"].append(f"pip changed preinstalled packages: {changed}")
            restore(VENV, before, after)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lessons", nargs="*", help="'setup', lesson numbers (e.g. 02), or notebook paths")
    parser.add_argument("--out", default=str(OUT), help="where executed notebooks and report.json go")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    if args.lessons == ["setup"]:
        setup()
        return 0
    setup()
    python = subprocess.run([str(VENV / "bin" / "python"), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"Colab-like environment: {VENV} ({python}; {colab_python()[1]})", flush=True)
    todo = []
    for item in args.lessons or ["[0-9][0-9]"]:
        todo += [Path(item)] if item.endswith(".ipynb") else sorted((ROOT / "notebooks").glob(f"{item}_*.ipynb"))
    out.mkdir(parents=True, exist_ok=True)
    from dataferry.course.lab import Lab

    lab = Lab(state_dir=out / "lab-state").up()
    reports = []
    try:
        print(f"the public buckets, played by a lab at {lab.endpoint} ...", flush=True)
        sizes = serve_public_data(lab)
        for i, nb in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {nb.stem} as in Colab ...", end=" ", flush=True)
            report = rehearse(nb, lab, sizes, out)
            reports.append(report)
            reads = "; ".join(f"gs://{b}: {r['files']} files, {r['bytes'] / 1e6:.1f} MB" for b, r in report["reads"].items())
            print(f"{report.get('seconds', 0):.0f} s; read {reads or 'nothing from a bucket'}; "
                  f"{len(report['results'])} result files", flush=True)
            for problem in report["problems"]:
                print(textwrap.indent(f"FAILED: {problem}", "    "), flush=True)
    finally:
        lab.down()
    python, why = colab_python()
    (out / "report.json").write_text(json.dumps({"python": why, "lessons": reports}, indent=1))
    failed = [r["lesson"] for r in reports if r["problems"]]
    print(f"{len(reports) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
