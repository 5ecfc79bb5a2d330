"""The helpers install on their own (from the folder and from git), with lower-bounded deps only."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "helpers" / "pyproject.toml").read_text())


def _requirements():
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        reqs += [r for r in extra if not r.startswith("dataferry")]
    return reqs


def test_dependencies_are_lower_bounded_never_pinned():
    for req in _requirements():
        assert ">=" in req, f"{req}: give a lower bound"
        assert "==" not in req and "~=" not in req, f"{req}: never pin (Colab preinstalls many of these)"


def test_environment_yml_lists_the_same_packages():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = " ".join(env["dependencies"][:-1] + pip)
    for req in _requirements():
        name = re.split(r"[<>=\[ ]", req)[0]
        assert name in listed, f"{name} is in pyproject.toml but not in environment.yml"


def _pip_install(spec, target):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), spec], check=True, timeout=600)
    return subprocess.run(
        [sys.executable, "-c", "import dataferry, dataferry.course, dataferry.course.lab, dataferry.course.cli; print(dataferry.__file__)"],
        capture_output=True, text=True, env={"PYTHONPATH": str(target)}, check=True, timeout=60,
    ).stdout


def _ships_the_course_data(target):
    """The top-level data/ folder (linked into the package) is installed as plain files."""
    for shipped in ("data/results/README.md", "data/public/flowers.json", "data/public/landsat-scene.json"):
        path = target / "dataferry" / "course" / shipped
        assert path.is_file() and not path.is_symlink(), f"{shipped}: the top-level data/ ships as plain files"


def test_pip_install_from_folder(tmp_path):
    where = _pip_install(str(ROOT / "helpers"), tmp_path / "t")
    assert where.startswith(str(tmp_path / "t"))
    _ships_the_course_data(tmp_path / "t")
    assert (tmp_path / "t" / "bin" / "dataferry").exists(), "the console script is installed"


def test_pip_install_from_git_subdirectory(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout with commits")
    where = _pip_install(f"dataferry @ git+file://{ROOT}#subdirectory=helpers", tmp_path / "t")
    assert where.startswith(str(tmp_path / "t"))
    _ships_the_course_data(tmp_path / "t")


def test_builds_without_isolation_with_colabs_setuptools(tmp_path):
    """Colab preinstalls setuptools 75: the package's metadata must build with it, no isolation."""
    colab = ROOT / "build" / "colab" / "venv" / "bin" / "python"
    if not colab.exists():
        pytest.skip("no Colab-like venv (make colab-venv)")
    version = subprocess.run([str(colab), "-c", "import setuptools; print(setuptools.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == "75.2.0", "the Colab venv has Colab's setuptools"
    proc = subprocess.run([str(colab), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(tmp_path / "t"), str(ROOT / "helpers")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "t" / "dataferry" / "course" / "__init__.py").exists()
    _ships_the_course_data(tmp_path / "t")


def test_console_script_runs():
    out = subprocess.run([str(Path(sys.executable).parent / "dataferry"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"dataferry {PYPROJECT['project']['version']}"



#: The lessons' front door (the course layer, above the lab): each takes the lab when ``WHERE`` is the lab.
LESSON_FRONT_DOOR = {"lessondata.py", "lessondrive.py", "lessonfiles.py", "lessonlayouts.py", "lessonshards.py",
                     "lessontraining.py", "lessonau.py"}


def _imports(py):
    import ast

    for node in ast.walk(ast.parse(py.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module
                 else [])
        yield from ((node.lineno, n) for n in names)


def test_no_module_below_the_lab_imports_it():
    """Lower floors never import higher ones: only the lab itself, the lessons' front door above it and the
    command line (which wires every floor together) import dataferry.course.lab, not even lazily inside a function;
    and nothing but the course layer imports the front door. The user-facing benchmarks (dataferry.harness.bench,
    dataferry.harness.utilisation) leave their lab runs to dataferry.course.lab."""
    package = ROOT / "helpers" / "src" / "dataferry"
    offenders = []
    front = tuple(f"dataferry.course.{m.removesuffix('.py')}" for m in LESSON_FRONT_DOOR)
    for py in sorted(package.rglob("*.py")):
        rel = py.relative_to(package).as_posix()
        if rel.startswith("course/lab/") or rel == "course/cli.py" or rel.removeprefix("course/") in LESSON_FRONT_DOOR:
            continue
        for line, n in _imports(py):
            if n == "dataferry.course.lab" or n.startswith("dataferry.course.lab."):
                offenders.append(f"{rel}:{line} imports {n}")
            if n.startswith(front) and rel not in ("course/__init__.py", "course/clientdemos.py", "course/disconnect.py"):
                offenders.append(f"{rel}:{line} imports the lessons' front door ({n})")
    assert not offenders, offenders


def test_what_a_user_extends_the_package_with_is_exported_at_the_top():
    """To write a Source, catch every dataferry error, filter the cache-full warning, or resume shards
    mid-epoch, ``from dataferry import ...`` is enough; each name is the class its module defines."""
    import dataferry
    from dataferry.cache import CacheFullWarning
    from dataferry.errors import DataferryError
    from dataferry.shards import ShardLoader
    from dataferry.sources import Source

    for name, cls in {"Source": Source, "CacheFullWarning": CacheFullWarning, "ShardLoader": ShardLoader,
                      "DataferryError": DataferryError}.items():
        assert name in dataferry.__all__ and getattr(dataferry, name) is cls, name


def test_the_public_data_sets_are_read_from_the_shipped_manifests():
    """One place says what a public data set is: data/public/<name>.json, which the lessons' defaults, the
    lab's flowers and the Colab rehearsal's stand-ins all read."""
    from dataferry.course import PUBLIC_DATASETS
    from dataferry.errors import BadArgument
    from dataferry.course.lab.flowers import PUBLIC_COUNTS
    from dataferry.course.shipped import DATA, public_manifest

    assert DATA.resolve() == (ROOT / "data").resolve()
    assert sum(PUBLIC_COUNTS.values()) == 3670 and set(PUBLIC_COUNTS) == {"daisy", "dandelion", "roses", "sunflowers", "tulips"}
    assert PUBLIC_DATASETS["flowers"].uri == "gs://cloud-samples-data/ai-platform/flowers/"
    assert PUBLIC_DATASETS["landsat-scene"].suffix == public_manifest("landsat-scene")["suffix"] == ".TIF"
    with pytest.raises(BadArgument, match="known: flowers, landsat-scene"):
        public_manifest("imagenet")


#: The library a training script imports: every module at the top of the package is one of these, or one of the
#: two blocks above it (``harness``, ``course``).
LIBRARY = {"__init__", "errors", "host", "progress", "aio", "gcs_media", "sources", "mounts", "cache", "staging", "dataset",
           "decode", "ondevice", "crops", "shards", "checkpoints"}
BLOCKS = {"library": 0, "harness": 1, "course": 2}
PACKAGE = ROOT / "helpers" / "src" / "dataferry"


def _module_of(py):
    parts = list(py.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """Module -> the dataferry modules it imports: at the top, inside functions and for type checking alike
    (``from package import name`` names the submodule when ``name`` is one)."""
    import ast

    modules = {_module_of(py): py for py in PACKAGE.rglob("*.py")}
    graph = {}
    for module, py in modules.items():
        found = set()
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = module.split(".")[:len(module.split(".")) - node.level + (py.name == "__init__.py")]
                origin = ".".join(base + [node.module or ""]).strip(".") if node.level else node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    found.add(target)
        graph[module] = found
    return graph


def _block(module):
    part = module.split(".")[1] if "." in module else "__init__"
    if part in ("harness", "course"):
        return part
    assert part in LIBRARY, f"{module}: a new module at the top of the package: put it in a block (LIBRARY, harness/, course/)"
    return "library"


def test_the_library_harness_and_course_import_downwards_only():
    """The library imports neither the harness nor the course; the harness does not import the course."""
    offenders = [f"{m} ({_block(m)}) imports {n} ({_block(n)})" for m, names in sorted(_import_graph().items())
                 for n in sorted(names) if BLOCKS[_block(n)] > BLOCKS[_block(m)]]
    assert not offenders, offenders


def test_no_modules_import_each_other_in_a_circle():
    """Not even through a function's import or a type checker's: a circle means two modules are one idea, or one
    holds what the other should be given."""
    graph = _import_graph()
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while not circle or circle[-1] != v:
                circle.append(stack.pop())
                on_stack.discard(circle[-1])
            if len(circle) > 1:
                circles.append(sorted(circle))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, circles


def test_what_pip_installs_holds_no_benchmark_and_nothing_that_imports_pytest(tmp_path):
    """The benchmarks against peers stay in the repository's benchmarks/; test fixtures stay with the tests."""
    import shutil

    # A copy without the build/ folder an earlier install leaves behind (setuptools would ship its stale files).
    helpers = shutil.copytree(ROOT / "helpers", tmp_path / "helpers", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(tmp_path / "t"), str(helpers)], check=True, timeout=600)
    installed = sorted((tmp_path / "t" / "dataferry").rglob("*.py"))
    assert len(installed) == len(list(PACKAGE.rglob("*.py"))) > 50
    offenders = [f"{py.relative_to(tmp_path / 't')}:{line} imports {name}" for py in installed
                 for line, name in _imports(py) if name.split(".")[0] in ("pytest", "benchmarks", "_pytest")]
    assert not offenders, offenders
    assert not (tmp_path / "t" / "benchmarks").exists()
    assert not {py.stem for py in installed} & {"cachebench", "trainbench", "shardbench", "peers", "feedpeers", "fixtures"}


def test_an_old_import_path_reads_through_to_the_moved_module_with_a_warning():
    """Lessons and notebooks of the last release import ``dataferry.timing``, ``dataferry.lab``, ...: they keep
    working for one release, and say where the module went."""
    code = """if True:
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as seen:
            from dataferry.timing import evict, load_results, timed_read
            from dataferry.lab.profiles import PROFILES
            import dataferry.plots.figures
        from dataferry.harness import pagecache, results, timing
        from dataferry.course.lab import profiles
        assert (evict, load_results, timed_read) == (pagecache.evict, results.load_results, timing.timed_read)
        assert PROFILES is profiles.PROFILES
        said = [str(w.message) for w in seen if w.category is FutureWarning]
        assert any("dataferry.lab.profiles moved to dataferry.course.lab.profiles" in s for s in said), said
        assert any(s.startswith("dataferry.timing moved to dataferry.harness.timing") for s in said), said
        import dataferry
        from dataferry.stage import Prefetcher
        import dataferry.staging
        assert Prefetcher is dataferry.staging.Prefetcher
        dataferry.staging.stage = lambda *args: args
        assert dataferry.stage(1, 2) == (1, 2), "dataferry.stage is still the function"
        try:
            import dataferry.nothing_here
        except ImportError:
            pass
        else:
            raise AssertionError("an unknown module imported")
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
