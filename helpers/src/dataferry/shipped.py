"""The course's data that ships inside the package: manifests of the public data sets the lessons read
(and the offline lab mirrors), and the runs from real clouds that the analysis lesson pools.

They live in the repository's top-level ``data/`` folder; ``dataferry/data`` links to it, so a wheel or a
``pip install`` from git carries them as plain files wherever the package goes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dataferry.errors import BadArgument

__all__ = ["DATA", "public_manifest", "shipped_results"]

#: The shipped data folder.
DATA = Path(__file__).with_name("data")


def public_manifest(name: str) -> dict[str, Any]:
    """What the course knows of a public data set (``flowers``, ``landsat-scene``): bucket, prefix, suffix,
    where Google documents it, and the counts or sizes the lab's stand-in reproduces. A new dict each call,
    so a caller that changes it changes no one else's."""
    path = DATA / "public" / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (DATA / "public").glob("*.json"))
        raise BadArgument(f"no manifest for the public data set {name!r}; known: {', '.join(known) or 'none'}")
    return json.loads(path.read_text())


def shipped_results() -> Path:
    """The runs from real clouds that ship with the course, one folder each (contributed through lesson 07)."""
    return DATA / "results"
