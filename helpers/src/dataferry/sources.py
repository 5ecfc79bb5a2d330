"""Where training bytes live: a folder (local disk, a Drive or gcsfuse mount) or a GCS bucket.

A :class:`Source` lists :class:`Entry` rows (name, size, version, checksum) as a stream, and
copies one entry's bytes into a file object, optionally from an offset so an interrupted copy
can resume. The version pins the bytes: a GCS generation, or size + mtime + inode for a file, so
a cache keyed by it never serves an object that has changed since.

Names are untrusted input: a source refuses names that would leave its root.
Of dataferry's modules it imports only its transport (``gcs_media``, ``aio``), lazily.
"""

from __future__ import annotations

import ctypes
import errno
from array import array
from itertools import accumulate
import os
import stat as statmod
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

__all__ = ["Entry", "EntryTable", "Source", "LocalSource", "GCSSource", "from_uri", "SourceError", "NotFoundAtSource",
           "ChangedAtSource", "fetches_async", "is_transient", "retry_policy", "Attempts", "safe_name", "where",
           "DEFAULT_RETRY_DEADLINE_S"]

CHUNK = 1 << 20
DEFAULT_RETRY_DEADLINE_S = 120.0


class SourceError(RuntimeError):
    """A source could not list or read; the message names the object and what to do."""


class NotFoundAtSource(SourceError, FileNotFoundError):
    """The object (or the bucket or folder) does not exist."""


class ChangedAtSource(SourceError):
    """The object changed at the source since it was listed: list again to get the new version."""


@dataclass(frozen=True)
class Entry:
    """One object: ``name`` relative to the source root, ``size`` in bytes, ``version`` (GCS
    generation, or size-mtime_ns-inode for files) and ``crc32c`` (base64, as GCS gives it) when known."""

    name: str
    size: int
    version: str
    crc32c: str | None = None


class EntryTable(Sequence):
    """Entries held compactly: names, versions and checksums in three byte strings, sizes and
    offsets in ``array``\\s; an :class:`Entry` is made only when one is asked for.

    32 bytes per entry plus the bytes of its name, version and checksum (a list of
    :class:`Entry` costs ~270), and no per-entry Python objects, so DataLoader workers forked from
    the process share its pages instead of copying them as reference counts change."""

    def __init__(self, entries: Iterable[Entry] = (), *, sort_by_name: bool = False) -> None:
        columns: tuple[list, list, list] = ([], [], [])
        sizes = array("q")
        for e in entries:
            columns[0].append(e.name)
            columns[1].append(e.version)
            columns[2].append(e.crc32c or "")
            sizes.append(e.size)
        if sort_by_name and any(a > b for a, b in zip(columns[0], columns[0][1:])):  # a bucket lists sorted
            order = sorted(range(len(sizes)), key=columns[0].__getitem__)
            columns = tuple([column[i] for i in order] for column in columns)  # type: ignore[assignment]
            sizes = array("q", (sizes[i] for i in order))
        self._sizes = sizes
        self._blobs, self._ends = {}, {}
        for field, column in zip(("name", "version", "crc32c"), columns):
            encoded = [text.encode("utf-8", "surrogateescape") for text in column]
            self._blobs[field] = b"".join(encoded)
            self._ends[field] = array("q", accumulate(map(len, encoded)))

    def _text(self, field: str, i: int) -> str:
        ends = self._ends[field]
        return self._blobs[field][ends[i - 1] if i else 0:ends[i]].decode("utf-8", "surrogateescape")

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        return Entry(self._text("name", i), self._sizes[i], self._text("version", i), self._text("crc32c", i) or None)

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes)

    def __repr__(self) -> str:
        return f"<EntryTable {len(self)} entries, {self.total_bytes / 1e6:.1f} MB>"


@runtime_checkable
class Source(Protocol):
    """What the cache needs from a place where bytes live."""

    uri: str

    def list(self) -> Iterator[Entry]:
        """Every entry, streamed in the source's order."""

    def stat(self, name: str) -> Entry:
        """The current entry for ``name``; :class:`NotFoundAtSource` if there is none."""

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        """Write the bytes of ``entry`` from offset ``start`` to ``out``; return how many were written.
        ``timeout`` bounds each network wait (connecting, and each gap between bytes: a stall).
        Raises :class:`ChangedAtSource` when that version is gone."""


def fetches_async(source: Source) -> bool:
    """Whether ``source`` offers ``fetch_async`` (a bucket): then many downloads share one event loop."""
    return hasattr(source, "fetch_async")


def where(source: Source, name: str) -> str:
    """``source.uri`` and ``name`` joined by one '/', for messages: ``file:///data/sub/x.bin``."""
    return f"{source.uri.rstrip('/')}/{name}"


def safe_name(name: str) -> str:
    """Check an untrusted object name for use under a root folder, or raise ``ValueError``.

    Refuses NUL, absolute paths, empty names and any ``.``/``..`` component, so a joined path
    cannot leave the root (control characters and unicode are fine: they stay inside)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"invalid object name {name!r}: empty")
    if "\0" in name:
        raise ValueError(f"invalid object name {name!r}: contains NUL")
    if name.startswith("/"):
        raise ValueError(f"invalid object name {name!r}: absolute paths are not allowed")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"invalid object name {name!r}: '.', '..' and empty path parts are not allowed")
    return name


# -- transient errors -----------------------------------------------------------------------------

_TRANSIENT_ERRNOS = {errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                     errno.EPIPE, errno.EAGAIN}


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: 408/429/5xx, resets, timeouts, a FUSE mount that blinked."""
    import http.client

    import requests
    import urllib3
    from google.api_core import exceptions as gexc

    try:
        from google.cloud.storage.exceptions import InvalidResponse
    except ImportError:  # google-cloud-storage < 3
        from google.resumable_media import InvalidResponse  # type: ignore[no-redef]

    if isinstance(exc, gexc.GoogleAPICallError):
        return getattr(exc, "code", None) in (408, 429, 500, 502, 503, 504)
    if isinstance(exc, InvalidResponse):
        status = getattr(exc.response, "status_code", None)
        return status in (408, 429, 500, 502, 503, 504)
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                        urllib3.exceptions.ProtocolError, urllib3.exceptions.TimeoutError,
                        urllib3.exceptions.NewConnectionError, http.client.HTTPException)):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return False


def retry_policy(deadline_s: float, on_error, predicate=is_transient):
    """The one retry policy of listings and fills: backoff from 0.1 s to 5 s for ``deadline_s``,
    retrying what ``predicate`` calls transient; ``on_error`` sees every failed attempt."""
    from google.api_core.retry import Retry

    return Retry(predicate=predicate, initial=0.1, maximum=5.0, multiplier=2.0, timeout=deadline_s,
                 on_error=on_error)


class Attempts:
    """Counts the failed attempts of one retried call, and says how it ended."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.t0 = time.monotonic()

    def __call__(self, exc: BaseException) -> None:
        self.errors.append(exc)

    def gave_up(self, what: str, cause: BaseException | None, how: str = "kept failing for") -> SourceError:
        """The error to raise: the real time spent and every attempt made, the last one included."""
        n = len(self.errors) + 1
        return SourceError(f"{what} {how} {time.monotonic() - self.t0:.0f} s ({n} attempt{'s' * (n != 1)}; "
                           f"last error: {cause!r}). Check the connection and try again")


# -- opening beneath a root, never following a link out of it ---------------------------------

_SYS_OPENAT2 = 437  # the same number on every architecture Linux added it to (5.6+)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_BENEATH = 0x02, 0x08
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dir_fd: int, name: str, flags: int) -> int:
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(name)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), name)
    return int(fd)


def _walk_no_follow(dir_fd: int, name: str, flags: int) -> int:
    """Where openat2 is missing: open each component relative to the last, following no link."""
    parts = name.split("/")
    fd = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError:  # a link, or a file where a folder should be
                if statmod.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a link in the path", name) from None
                raise
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


_HAS_OPENAT2 = True


def open_beneath(root: str | os.PathLike[str], name: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor for ``root/name`` that cannot lead outside ``root``, however its folders are
    swapped for links meanwhile: ``openat2(RESOLVE_BENEATH)``, else a walk that follows no link.
    ``ValueError`` when the name leads outside; ``OSError`` as ``open`` raises otherwise."""
    global _HAS_OPENAT2
    safe_name(name)
    flags |= os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO planted under the name must not block us
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _HAS_OPENAT2:
            try:
                return _openat2(root_fd, name, flags)
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refused it
                    raise
                _HAS_OPENAT2 = False
        return _walk_no_follow(root_fd, name, flags)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.ELOOP):
            raise ValueError(f"invalid object name {name!r}: it leads outside {root} (through a link)") from None
        raise
    finally:
        os.close(root_fd)


# -- a folder ---------------------------------------------------------------------------------------


class LocalSource:
    """A folder: local disk, a Google Drive mount, a gcsfuse mount. Names are '/'-separated paths
    relative to ``root``, opened so that no link can lead outside ``root`` (:func:`open_beneath`)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.uri = self.root.as_uri()

    def _open(self, name: str) -> int:
        try:
            return open_beneath(self.root, name)
        except FileNotFoundError:
            raise NotFoundAtSource(f"{where(self, name)} not found") from None

    @staticmethod
    def _entry(name: str, st: os.stat_result) -> Entry:
        return Entry(name, st.st_size, f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}")

    def list(self) -> Iterator[Entry]:
        if not self.root.is_dir():
            raise NotFoundAtSource(f"{self.root} is not a folder: check the path (is the drive mounted?)")
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(self.root / rel if rel else self.root) as it:
                for d in it:
                    name = f"{rel}/{d.name}" if rel else d.name
                    if d.is_dir(follow_symlinks=False):
                        stack.append(name)
                    elif d.is_file(follow_symlinks=False):
                        yield self._entry(name, d.stat(follow_symlinks=False))

    def stat(self, name: str) -> Entry:
        fd = self._open(name)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not statmod.S_ISREG(st.st_mode):
            raise NotFoundAtSource(f"{where(self, name)} is not a regular file")
        return self._entry(name, st)

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        fd = self._open(entry.name)
        with open(fd, "rb", closefd=True) as f:
            if self._entry(entry.name, os.fstat(f.fileno())).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed since it was listed: list again")
            f.seek(start)
            n = 0
            while chunk := f.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
            # A file rewritten in place while we copied it would leave a mix of old and new bytes.
            if self._entry(entry.name, os.fstat(f.fileno())).version != entry.version:
                raise ChangedAtSource(f"{where(self, entry.name)} changed while it was copied: nothing of it "
                                      "was kept; read it again for its new version")
        return n

    def __reduce__(self) -> tuple[Any, ...]:
        return (LocalSource, (self.root,))

    def __repr__(self) -> str:
        return f"LocalSource({str(self.root)!r})"


# -- a GCS bucket -------------------------------------------------------------------------------------


class GCSSource:
    """Objects under ``prefix`` in a GCS bucket, through google-cloud-storage.

    Works unchanged against real GCS and the lab: without a ``client``, one is made per process
    with ``storage.Client()``, which honours ``STORAGE_EMULATOR_HOST``. A given client is used in
    the process that made it; a worker process (fork or spawn) makes its own from the same
    project, credentials and endpoint. Clients are never pickled.
    """

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, *,
                 retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}: give the bare name, e.g. 'my-data'")
        self.bucket = bucket
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
            from google.cloud import storage

            self._client = _tuned(storage.Client(**(self._settings or {})))
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

    def list(self) -> Iterator[Entry]:
        """Every object under the prefix, page by page; each page request retried like a fill."""
        from google.api_core.exceptions import NotFound, RetryError

        attempts = Attempts()
        blobs = self._client_here().list_blobs(self.bucket, prefix=self.prefix or None, page_size=1000,
                                               fields="items(name,size,generation,crc32c),nextPageToken",
                                               retry=retry_policy(self.retry_deadline_s, attempts))
        try:
            for blob in blobs:
                if not (blob.name.endswith("/") and blob.size == 0):  # folder placeholders hold no data
                    yield self._entry(blob)
        except NotFound:
            raise self._missing("listing") from None
        except RetryError as e:
            raise attempts.gave_up(f"listing {self.uri}", e.cause) from e.cause

    def stat(self, name: str) -> Entry:
        blob = self._bucket().get_blob(self.prefix + name)
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


def from_uri(uri: str, client: Any = None) -> LocalSource | GCSSource:
    """``gs://bucket/prefix`` -> :class:`GCSSource` (read with ``client`` if given); anything else is
    a folder -> :class:`LocalSource`."""
    if uri.startswith("gs://"):
        bucket, _, prefix = uri[5:].partition("/")
        return GCSSource(bucket, prefix, client=client)
    return LocalSource(uri.removeprefix("file://"))
