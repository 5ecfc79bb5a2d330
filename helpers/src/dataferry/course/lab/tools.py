"""The lab's programs, built from pinned sources with the machine's Go.

Each tool has a list of pinned versions, best first. ``go install`` runs with
``GOTOOLCHAIN=local`` so that the machine's Go is used as it is (nothing is downloaded besides
modules); a version whose ``go.mod`` asks for a newer Go is skipped for the next pin. Binaries
land in a tools folder (``$DATAFERRY_TOOLS``, else ``~/.cache/dataferry/tools``) named
``NAME-VERSION``, so a changed pin rebuilds and an unchanged one is reused at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from dataferry.course.lab.errors import ToolError

__all__ = ["Tool", "TOOLS", "MIN_GO", "tools_dir", "find_tool", "ensure_tool", "go_version"]

MIN_GO = (1, 24)


@dataclass(frozen=True)
class Tool:
    """A program the lab builds: its name, Go package path and pinned versions (best first)."""

    name: str
    package: str
    pins: tuple[str, ...]
    binary: str  # the file name go install writes

    def path(self, folder: Path, version: str) -> Path:
        return folder / f"{self.name}-{version}"


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        # v1.56.1 needs Go 1.26.
        Tool("fake-gcs-server", "github.com/fsouza/fake-gcs-server", ("v1.56.1", "v1.53.1"), "fake-gcs-server"),
        Tool("toxiproxy-server", "github.com/Shopify/toxiproxy/v2/cmd/server", ("v2.12.0",), "server"),
        # v3.11.4 needs Go >= 1.26.7; v3.12 and later need Go 1.27.
        Tool("gcsfuse", "github.com/googlecloudplatform/gcsfuse/v3", ("v3.11.4",), "gcsfuse"),
    )
}


def tools_dir() -> Path:
    """Where built tools live: ``$DATAFERRY_TOOLS`` or ``~/.cache/dataferry/tools``."""
    env = os.environ.get("DATAFERRY_TOOLS")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "dataferry" / "tools"


def go_version() -> tuple[int, int, int] | None:
    """The version of ``go`` on PATH, or None when there is none."""
    go = shutil.which("go")
    if go is None:
        return None
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"go(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


def find_tool(name: str, folder: Path | None = None) -> tuple[Path, str] | None:
    """The built binary of ``name`` and its version, preferring the first pin; None if none is built."""
    tool = TOOLS[name]
    folder = folder or tools_dir()
    for version in tool.pins:
        p = tool.path(folder, version)
        if p.is_file() and os.access(p, os.X_OK):
            return p, version
    return None


_NEEDS_NEWER_GO = re.compile(r"requires go >= |toolchain not available|go: downloading go\d|GOTOOLCHAIN=local")


def _go_install(tool: Tool, version: str, folder: Path, log: Path) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".build-{tool.name}-") as gobin:
        env = {**os.environ, "GOBIN": gobin, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
        proc = subprocess.run(
            ["go", "install", f"{tool.package}@{version}"],
            capture_output=True, text=True, env=env, timeout=1800,
        )
        with open(log, "a") as f:
            f.write(f"$ GOTOOLCHAIN=local go install {tool.package}@{version}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("go: downloading")]
            return False, (lines[-1] if lines else f"exit code {proc.returncode}")
        os.replace(Path(gobin) / tool.binary, tool.path(folder, version))
    return True, ""


def ensure_tool(name: str, folder: Path | None = None) -> tuple[Path, str]:
    """Return (binary, version) for ``name``, building it with ``go install`` if needed.

    Raises :class:`ToolError` with one line saying what to do when Go is missing or every pin
    fails to build (the full compiler output is in ``build.log`` in the tools folder).
    """
    if name not in TOOLS:
        raise ToolError(f"unknown lab tool {name!r}; the lab builds {', '.join(TOOLS)}")
    folder = folder or tools_dir()
    found = find_tool(name, folder)
    if found:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f".{name}.lock")):
        found = find_tool(name, folder)
        if found:
            return found
        go = go_version()
        if go is None:
            raise ToolError(
                f"cannot build {name}: Go is not installed or not on PATH. The lab builds its tools from "
                f"source and needs Go >= {MIN_GO[0]}.{MIN_GO[1]} (1.26.7 or later for the preferred pins)."
            )
        tool = TOOLS[name]
        log = folder / "build.log"
        failures = []
        for version in tool.pins:
            ok, why = _go_install(tool, version, folder, log)
            if ok:
                return tool.path(folder, version), version
            failures.append(f"{version}: {why}")
            if not _NEEDS_NEWER_GO.search(why):
                break
        goname = "go" + ".".join(map(str, go))
        raise ToolError(f"building {name} with {goname} failed ({'; '.join(failures)}); full output in {log}")
