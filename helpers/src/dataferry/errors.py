"""The one root of dataferry's errors, and the error of an argument that cannot work.

Every exception the package raises on purpose is a :class:`DataferryError` and also the builtin its
callers already catch (``OSError``, ``FileNotFoundError``, ``PermissionError``, ``TimeoutError``,
``ValueError``, ``RuntimeError``), as ``requests`` roots its errors in ``IOError``. The floor below
every module: it imports none of them.
"""

from __future__ import annotations

import math
import os
import sys
from typing import NoReturn

__all__ = ["DataferryError", "BadArgument", "MissingPath", "byte_count", "interrupted_at_exit"]


class DataferryError(Exception):
    """Something dataferry could not do; the message says what and what to do instead."""


class BadArgument(DataferryError, ValueError):
    """An argument that cannot work (a budget that is not a byte count, an unknown method, a file
    where a folder is needed): the message names it and what it takes."""


class MissingPath(DataferryError, FileNotFoundError):
    """A file or folder given as an argument does not exist."""


def byte_count(name: str, value: object, *, unset: str = "") -> int:
    """``value`` as a whole number of bytes: a finite number >= 0 (``1e9`` and ``4_000_000`` alike);
    :class:`BadArgument` naming ``name`` otherwise. ``unset``: what leaving it unset means, for the message."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise BadArgument(f"{name}={value!r} is not a byte count: give a finite number >= 0"
                          + (f" ({unset})" if unset else ""))
    if number >= 2**63:
        raise BadArgument(f"{name}={value!r} is more bytes than any disk holds: give a byte count below 2**63"
                          + (f" ({unset})" if unset else ""))
    return int(number)


def interrupted_at_exit(what: str) -> NoReturn:
    """Ctrl-C while the process exits and ``what`` is under way: one line and status 130, instead of
    Python's 'Exception ignored in atexit callback' traceback and status 0."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    sys.stderr.write(f"dataferry: interrupted while {what}\n")
    sys.stderr.flush()
    os._exit(130)
