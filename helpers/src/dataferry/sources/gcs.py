"""A GCS bucket as a source, through google-cloud-storage (listing, one-shot fetches) and aiohttp
(:mod:`dataferry.gcs_media`, fetches on the download loop). Imports google libraries lazily."""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from dataferry.errors import BadArgument
from dataferry.sources.base import (DEFAULT_RETRY_DEADLINE_S, ChangedAtSource, Entry, NoCredentials, NotFoundAtSource,
                                    where)
from dataferry.sources.retries import Attempts, retry_policy

__all__ = ["GCSSource", "POOL_SIZE", "bucket_name", "signed_in_client"]

_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,220}[a-z0-9])?")  # GCS's bucket names


def bucket_name(name: object) -> str:
    """``name`` if it can name a bucket (a-z, 0-9, '-', '_', '.'; what Google's library would refuse with a raw
    error, refused here in one line), else :class:`~dataferry.BadArgument`."""
    if not isinstance(name, str) or not _BUCKET.fullmatch(name):
        raise BadArgument(f"invalid bucket name {name!r}: give the bare name (up to 222 of a-z, 0-9, '-', '_', '.'; "
                          "no gs://, no '/', no spaces), e.g. 'my-data'")
    return name


class GCSSource:
    """Objects under ``prefix`` in a GCS bucket, through google-cloud-storage.

    Works unchanged against real GCS and the lab: without a ``client``, one is made per process
    with ``storage.Client()``, which honours ``STORAGE_EMULATOR_HOST``. A given client is used in
    the process that made it; a worker process (fork or spawn) makes its own from the same
    project, credentials and endpoint. Clients are never pickled.
    """

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, *,
                 retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S) -> None:
        self.bucket = bucket_name(bucket)
        # A prefix is a folder: "train" lists train/..., never train_old/...
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"gs://{bucket}/{self.prefix}"
        self.retry_deadline_s = retry_deadline_s
        self._client = _tuned(client) if client is not None else None
        self._pid = os.getpid()
        self._settings = None if client is None else {
            "project": client.project, "credentials": client._credentials,
            "client_options": {"api_endpoint": client.api_endpoint},
        }

    def _client_here(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = _tuned(signed_in_client(self.uri, **(self._settings or {})))
            self._pid = os.getpid()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_pid": None}

    def _bucket(self) -> Any:
        return self._client_here().bucket(self.bucket)

    def _entry(self, blob: Any) -> Entry:
        return Entry(blob.name[len(self.prefix):], blob.size, str(blob.generation), blob.crc32c)

    def _missing(self, what: str) -> NotFoundAtSource:
        from google.api_core.exceptions import NotFound

        try:
            self._bucket().reload()
        except NotFound:
            return NotFoundAtSource(f"bucket gs://{self.bucket} does not exist (or you may not see it): "
                                    "check the name and the project")
        return NotFoundAtSource(f"{what} not found in gs://{self.bucket}/{self.prefix}")

    def _blobs(self, fields: str, **options: Any) -> Iterator[Any]:
        """The pages of a listing of the prefix, each page request retried like a fill; a missing bucket or a
        listing that kept failing as one :class:`SourceError`."""
        from google.api_core.exceptions import NotFound, RetryError

        attempts = Attempts()
        blobs = self._client_here().list_blobs(self.bucket, prefix=self.prefix or None, page_size=1000,
                                               fields=f"{fields},nextPageToken",
                                               retry=retry_policy(self.retry_deadline_s, attempts), **options)
        try:
            yield from blobs.pages
        except NotFound:
            raise self._missing("listing") from None
        except RetryError as e:
            raise attempts.gave_up(f"listing {self.uri}", e.cause) from e.cause

    def list(self) -> Iterator[Entry]:
        """Every object under the prefix, page by page; each page request retried like a fill."""
        for page in self._blobs("items(name,size,generation,crc32c)"):
            for blob in page:
                if not (blob.name.endswith("/") and blob.size == 0):  # folder placeholders hold no data
                    yield self._entry(blob)

    def folders(self) -> builtins.list[str]:
        """The folders at the top of the prefix, as a gcsfuse mount shows them: every name before a first '/',
        an empty folder's placeholder object (``bird/``, as the Cloud console makes) included."""
        return sorted(p[len(self.prefix):].rstrip("/")
                      for page in self._blobs("items(name),prefixes", delimiter="/") for p in page.prefixes)

    def stat(self, name: str) -> Entry:
        """The object's current entry, asked for with the source's retry policy (within ``retry_deadline_s``)."""
        from google.api_core.exceptions import RetryError

        attempts = Attempts()
        try:
            blob = self._bucket().get_blob(self.prefix + name, retry=retry_policy(self.retry_deadline_s, attempts))
        except RetryError as e:
            raise attempts.gave_up(f"asking for {where(self, name)}", e.cause) from e.cause
        if blob is None:
            raise self._missing(repr(name))
        return self._entry(blob)

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        from google.api_core.exceptions import NotFound
        from google.cloud.storage.constants import _DEFAULT_TIMEOUT

        blob = self._bucket().blob(self.prefix + entry.name, generation=int(entry.version))
        counter = _Counting(out)
        if start >= entry.size:
            return 0
        try:
            # One attempt: the caller retries (and resumes from the bytes it has) and checks the crc32c.
            blob.download_to_file(counter, start=start or None, raw_download=True, checksum=None, retry=None,
                                  timeout=(timeout, timeout) if timeout else _DEFAULT_TIMEOUT)
        except NotFound:
            raise ChangedAtSource(
                f"{where(self, entry.name)} generation {entry.version} is gone: the object changed or was deleted "
                "since it was listed; list again") from None
        return counter.n

    async def fetch_async(self, entry: Entry, out: BinaryIO, start: int = 0, end: int | None = None,
                          timeout: float | None = None, total: float | None = None) -> int:
        """:meth:`fetch` as a coroutine, of bytes ``start``..``end`` (exclusive), over aiohttp
        (:func:`dataferry.gcs_media.media_get`): hundreds in flight on one thread. ``timeout``
        bounds each wait for bytes, ``total`` the whole call (``TimeoutError``)."""
        from google.api_core.exceptions import NotFound

        from dataferry.gcs_media import media_get

        end = entry.size if end is None else end
        if start >= end:
            return 0
        try:
            return await media_get(self._client_here(), self.bucket, self.prefix + entry.name, entry.version, out,
                                   start, end if end < entry.size else None, timeout, total)
        except NotFound:
            raise ChangedAtSource(
                f"{where(self, entry.name)} generation {entry.version} is gone: the object changed or was deleted "
                "since it was listed; list again") from None

    def __repr__(self) -> str:
        return f"GCSSource({self.bucket!r}, {self.prefix!r})"


def signed_in_client(reading: str, **settings: Any) -> Any:
    """``storage.Client(**settings)``, or :class:`NoCredentials` saying how to sign in (in Colab and
    elsewhere) when there are no credentials to read ``reading`` (a ``gs://`` address, or words)."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    try:
        return storage.Client(**settings)
    except DefaultCredentialsError:
        raise NoCredentials(
            f"no Google credentials found to read {reading}. In Colab, run dataferry.mounts.authenticate() "
            "first (it signs you in); elsewhere run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file. A public bucket needs none: "
            "pass client=storage.Client.create_anonymous_client()") from None


_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
POOL_SIZE = 64


def _tuned(client: Any) -> Any:
    """Let one client serve many threads: a connection pool as large as a staging pool, and (when
    no proxy variable is set) no per-request scan of the environment, which costs requests
    ~0.7 ms of CPU per call; a CA bundle named in the environment is applied once instead."""
    import requests

    session = client._http
    for scheme in ("https://", "http://"):
        if type(session.get_adapter(scheme)) is requests.adapters.HTTPAdapter:  # leave mTLS adapters be
            session.mount(scheme, requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE))
    if not any(os.environ.get(v) or os.environ.get(v.lower()) for v in _PROXY_ENV):
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle and session.verify is True:
            session.verify = bundle  # what trust_env would have applied on every request
        session.trust_env = False
    return client


class _Counting:
    """A write-only file wrapper that counts bytes."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.n = out, 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.n += len(data)
        return len(data)
