"""Where training bytes live: a folder (local disk, a Drive or gcsfuse mount) or a GCS bucket.

A :class:`Source` lists :class:`Entry` rows (name, size, version, checksum) as a stream, and
copies one entry's bytes into a file object, optionally from an offset so an interrupted copy
can resume. The version pins the bytes: a GCS generation, or size + mtime + inode for a file, so
a cache keyed by it never serves an object that has changed since.

Names are untrusted input: a source refuses names that would leave its root.
Of dataferry's modules it imports only its transport (``gcs_media``, ``aio``), lazily.

- :mod:`~dataferry.sources.base`: :class:`Entry`, :class:`EntryTable`, the :class:`Source` protocol, errors;
- :mod:`~dataferry.sources.local`: :class:`LocalSource`, opened with :mod:`~dataferry.sources.beneath`;
- :mod:`~dataferry.sources.gcs`: :class:`GCSSource`;
- :mod:`~dataferry.sources.retries`: which errors are transient, and the retry policy.
"""

from __future__ import annotations

from typing import Any

from dataferry.sources.base import (DEFAULT_RETRY_DEADLINE_S, ChangedAtSource, Entry, EntryTable, NoCredentials,
                                    NotFoundAtSource, Source, SourceError, fetches_async, reads_wait_on_network,
                                    safe_name, top_folders, where)
from dataferry.sources.beneath import open_beneath
from dataferry.sources.gcs import GCSSource
from dataferry.sources.local import LocalSource
from dataferry.sources.retries import Attempts, is_transient, retry_policy, retry_policy_async

__all__ = ["Entry", "EntryTable", "Source", "LocalSource", "GCSSource", "from_uri", "SourceError", "NotFoundAtSource",
           "NoCredentials", "ChangedAtSource", "fetches_async", "reads_wait_on_network", "is_transient", "retry_policy", "retry_policy_async", "Attempts", "safe_name", "top_folders", "where",
           "open_beneath", "DEFAULT_RETRY_DEADLINE_S"]


def from_uri(uri: str, client: Any = None) -> LocalSource | GCSSource:
    """``gs://bucket/prefix`` -> :class:`GCSSource` (read with ``client`` if given); anything else is
    a folder -> :class:`LocalSource`."""
    if uri.startswith("gs://"):
        bucket, _, prefix = uri[5:].partition("/")
        return GCSSource(bucket, prefix, client=client)
    return LocalSource(uri.removeprefix("file://"))
