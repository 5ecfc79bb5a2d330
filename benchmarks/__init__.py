"""dataferry's benchmarks against its peers: run from the repository, never installed with the package.

    python -m benchmarks cache   # first reads against gcsfs, transfer_manager and gcsfuse's file cache (make bench-cache)
    python -m benchmarks shards  # tar shards against files and webdataset's cache, data 5x the budget (make bench-shards)
    python -m benchmarks train   # a training epoch against ImageFolder, DALI and litdata (make bench-train)

Each prints a table and writes JSON under ``build/bench/``; the tests check what they compute, not how fast it is.
"""

import os
from pathlib import Path

# Each benchmark runs its methods in child processes (``python -m benchmarks.peers ...``) started from other
# folders: they find this package where their parent found it.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
