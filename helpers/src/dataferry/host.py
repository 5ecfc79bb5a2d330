"""What a process can learn about the host it runs on: whether another process is alive, and
whether this is a Colab runtime. The floor below every other module: it imports none of them."""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["pid_alive", "in_colab", "COLAB_ENV_VARS"]

COLAB_ENV_VARS = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION")


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True when process ``pid`` runs (a zombie does not) and, if ``exe`` is given, runs that program."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    if stat[stat.rindex(")") + 2] in "ZX":
        return False
    if exe is not None:
        try:
            return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(exe)
        except OSError:
            return False
    return True


def in_colab() -> bool:
    """True in a Colab runtime: google.colab imported, or importable with one of Colab's variables set."""
    if "google.colab" in sys.modules:
        return True
    if not any(os.environ.get(name) for name in COLAB_ENV_VARS):
        return False
    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False
