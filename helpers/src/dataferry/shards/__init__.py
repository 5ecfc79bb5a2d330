"""Train from tar shards (WebDataset layout) streamed through the verified cache, and make them.

``make_shards`` packs files into shards with an index; :class:`ShardDataset` (PyTorch, imported on
first use) reads them epoch by epoch under the cache's budget, and :class:`ShardLoader` resumes mid-epoch.
"""

from __future__ import annotations

import importlib
from typing import Any

from dataferry.shards.make import INDEX, SHARD_BYTES, ShardInfo, make_shards, read_index
from dataferry.shards.tar import ShardFormatError, TarShardWriter, samples, split_name

__all__ = ["ShardDataset", "ShardLoader", "make_shards", "read_index", "ShardInfo", "INDEX", "SHARD_BYTES", "ShardFormatError",
           "TarShardWriter", "samples", "split_name"]


def __getattr__(name: str) -> Any:
    if name in ("ShardDataset", "ShardLoader"):
        return getattr(importlib.import_module(f"dataferry.shards.{name[5:].lower()}"), name)
    raise AttributeError(f"module 'dataferry.shards' has no attribute {name!r}")
