"""Where checkpoints go, one adapter per kind of destination, chosen once: a folder (a Drive folder, a gcsfuse
mount, a local disk) or a bucket prefix. Each creates names exclusively (``O_EXCL``; ``if_generation_match=0``),
so two savers are never both told they wrote one name, and turns its own errors into one
:class:`CheckpointError` line that says which side failed."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from dataferry.cache.checksum import file_crc
from dataferry.errors import DataferryError

__all__ = ["CheckpointError", "Destination", "FolderDestination", "BucketDestination", "Listed", "NameTaken",
           "DestinationFull", "LocalWriteFailed"]


class CheckpointError(DataferryError, RuntimeError):
    """A checkpoint could not be written, verified or found; the message says which and what to do."""


class NameTaken(Exception):
    """Another save created the name first."""


class DestinationFull(CheckpointError):
    """The destination has no room left for the copy (what was written of it is gone again)."""


class LocalWriteFailed(Exception):
    """Writing a fetched checkpoint to the local disk failed (not the destination): ``error`` says why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class Listed(NamedTuple):
    """A name at the destination: its size, its CRC32C when the listing gives it (a bucket's), and when it last
    changed (seconds since the epoch)."""

    size: int
    crc32c: str | None
    mtime: float


class Destination(Protocol):
    """What :class:`~dataferry.Checkpoints` needs of a destination."""

    where: str

    def listing(self, head: str) -> dict[str, Listed]: ...
    def create_text(self, name: str, text: str) -> None: ...
    def put_text(self, name: str, text: str) -> None: ...
    def get_text(self, name: str) -> str | None: ...
    def copy_in(self, local: Path, name: str, crc: str) -> None: ...
    def fetch(self, name: str, out: BinaryIO) -> None: ...
    def delete(self, name: str) -> None: ...
    def free_bytes(self) -> int | None: ...


class _ToLocal:
    """A file object over a local file that tells its own write errors apart from the destination's."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        try:
            return self.out.write(data)
        except OSError as e:
            raise LocalWriteFailed(e) from None


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark an editor added is no reason to drop a record
    except UnicodeDecodeError:
        return None


_FULL = (errno.ENOSPC, errno.EDQUOT)


class FolderDestination:
    """A folder, made if missing. Nothing relies on renaming, which not every FUSE file system does well."""

    def __init__(self, folder: Path, where: str) -> None:
        self.folder, self.where = folder, where
        with self._errors("create"):
            folder.mkdir(parents=True, exist_ok=True)

    def listing(self, head: str) -> dict[str, Listed]:
        out = {}
        with self._errors("list"):
            with os.scandir(self.folder) as it:
                for d in it:
                    if d.name.startswith(head):
                        with contextlib.suppress(FileNotFoundError):
                            st = d.stat()
                            out[d.name] = Listed(st.st_size, None, st.st_mtime)
        return out

    def _create(self, name: str) -> int:
        try:
            return os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            raise NameTaken(name) from None

    def create_text(self, name: str, text: str) -> None:
        with self._errors("write"):
            fd = self._create(name)
            with open(fd, "w", closefd=True) as f:
                f.write(text)

    def put_text(self, name: str, text: str) -> None:
        with self._errors("write"):
            (self.folder / name).write_text(text)

    def get_text(self, name: str) -> str | None:
        try:
            with self._errors("read"):
                return _text((self.folder / name).read_bytes())
        except (FileNotFoundError, IsADirectoryError):
            return None

    def copy_in(self, local: Path, name: str, crc: str) -> None:
        path = self.folder / name
        with self._errors("write"):
            os.close(self._create(name))
        try:
            with self._errors("write"):
                shutil.copyfile(local, path)
                got = file_crc(path)[1]  # read back through the mount: what landed, not what was sent
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()  # a failed copy never stays
            raise
        if got != crc:
            with contextlib.suppress(OSError):
                path.unlink()
            raise CheckpointError(f"the copy of {name} in {self.where} read back wrong (CRC32C {got}, expected "
                                  f"{crc}): the destination is failing; the previous checkpoint stays")

    def fetch(self, name: str, out: BinaryIO) -> None:
        """Copy ``name`` into ``out``; FileNotFoundError when it is gone."""
        with self._errors("read"), open(self.folder / name, "rb") as f:
            shutil.copyfileobj(f, _ToLocal(out), 1 << 20)  # type: ignore[misc]

    def delete(self, name: str) -> None:
        with self._errors("delete from"):
            (self.folder / name).unlink(missing_ok=True)

    def free_bytes(self) -> int | None:
        with contextlib.suppress(OSError):
            return shutil.disk_usage(self.folder).free
        return None

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """An OSError of the folder as a :class:`CheckpointError` (a missing file stays one)."""
        try:
            yield
        except (FileNotFoundError, IsADirectoryError):
            if doing in ("read", "delete from"):
                raise
            raise CheckpointError(f"cannot {doing} {self.where}: it does not exist, or a part of the path is "
                                  "missing (is Drive still mounted?); nothing was changed") from None
        except OSError as e:
            if e.errno in _FULL:
                raise DestinationFull(f"{self.where} is full ({e.strerror}): free room there, or save elsewhere; "
                                      "the previous checkpoint stays the latest") from None
            raise CheckpointError(f"cannot {doing} {self.where} ({e.strerror or e}): check the folder (is Drive "
                                  "still mounted?); the previous checkpoint stays the latest") from None


class BucketDestination:
    """Objects under ``prefix`` in a bucket, each call retried for up to ``timeout_s``. An upload is whole or
    absent: a bucket never holds a torn object."""

    def __init__(self, client: Any, bucket: str, prefix: str, where: str, timeout_s: float) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        self.bucket, self.prefix, self.where = client.bucket(bucket), prefix, where
        self.retry, self.timeout_s = DEFAULT_RETRY.with_timeout(timeout_s), timeout_s

    def _blob(self, name: str) -> Any:
        return self.bucket.blob(self.prefix + name)

    def listing(self, head: str) -> dict[str, Listed]:
        with self._errors("list"):
            return {b.name[len(self.prefix):]: Listed(b.size, b.crc32c, b.updated.timestamp() if b.updated else 0.0)
                    for b in self.bucket.list_blobs(prefix=self.prefix + head, retry=self.retry, timeout=self.timeout_s)}

    def create_text(self, name: str, text: str) -> None:
        from google.api_core.exceptions import PreconditionFailed

        try:
            with self._errors("save to", missing=PreconditionFailed):
                self._blob(name).upload_from_string(text, content_type="application/json", if_generation_match=0,
                                                    timeout=self.timeout_s)
        except PreconditionFailed:
            raise NameTaken(name) from None

    def put_text(self, name: str, text: str) -> None:
        with self._errors("save to"):
            self._blob(name).upload_from_string(text, content_type="application/json", timeout=self.timeout_s)

    def get_text(self, name: str) -> str | None:
        from google.api_core.exceptions import NotFound

        try:
            with self._errors("read from", missing=NotFound):
                return _text(self._blob(name).download_as_bytes(retry=self.retry, timeout=self.timeout_s))
        except NotFound:
            return None

    def copy_in(self, local: Path, name: str, crc: str) -> None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob(name)
        try:
            with self._errors("save to", missing=PreconditionFailed):
                blob.upload_from_filename(str(local), checksum="crc32c", if_generation_match=0, timeout=self.timeout_s)
                blob.reload(retry=self.retry, timeout=self.timeout_s)
        except PreconditionFailed:
            raise NameTaken(name) from None
        if blob.crc32c != crc:
            raise CheckpointError(f"{self.where}{name} holds CRC32C {blob.crc32c}, expected {crc}: the previous "
                                  "checkpoint stays the latest")

    def fetch(self, name: str, out: BinaryIO) -> None:
        from google.api_core.exceptions import NotFound

        try:
            with self._errors("read from", missing=NotFound):
                self._blob(name).download_to_file(_ToLocal(out), retry=self.retry, timeout=self.timeout_s)
        except NotFound:
            raise FileNotFoundError(name) from None

    def delete(self, name: str) -> None:
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound), self._errors("delete from", missing=NotFound):
            self._blob(name).delete(retry=self.retry, timeout=self.timeout_s)

    def free_bytes(self) -> int | None:
        return None

    @contextlib.contextmanager
    def _errors(self, doing: str, missing: type[BaseException] | None = None) -> Iterator[None]:
        """google-cloud-storage's errors as one :class:`CheckpointError` line; ``missing`` (an object's NotFound,
        or a precondition) passes through when the bucket itself exists."""
        from google.api_core.exceptions import Forbidden, GoogleAPIError, NotFound, RetryError
        from google.auth.exceptions import GoogleAuthError, TransportError
        from requests.exceptions import RequestException

        try:
            from google.cloud.storage.exceptions import DataCorruption
        except ImportError:  # google-cloud-storage < 3
            from google.resumable_media import DataCorruption  # type: ignore[no-redef]

        where = f"gs://{self.bucket.name}"
        try:
            yield
        except LocalWriteFailed:
            raise
        except NotFound as e:
            if missing is not None and isinstance(e, missing) and self._may_exist():
                raise
            raise CheckpointError(f"bucket {where} does not exist (or you may not use it): check the name; "
                                  "nothing was changed") from None
        except Forbidden as e:
            raise CheckpointError(f"you may not {doing} {where} ({e.message}): sign in with an account that may, "
                                  "or choose a bucket of your own") from None
        except (RetryError, RequestException, ConnectionError, TimeoutError, TransportError) as e:
            raise CheckpointError(f"could not reach {where} to {doing} it within {self.timeout_s:g} s "
                                  f"({e.__class__.__name__}): check the network or the endpoint; the previous "
                                  "checkpoint stays the latest") from None
        except GoogleAPIError as e:
            if missing is not None and isinstance(e, missing):
                raise
            raise CheckpointError(f"could not {doing} {where} ({e.__class__.__name__}: {e}); the previous "
                                  "checkpoint stays the latest") from None
        except (GoogleAuthError, DataCorruption) as e:
            raise CheckpointError(f"could not {doing} {where} ({e.__class__.__name__}: {e}); the previous "
                                  "checkpoint stays the latest") from None

    def _may_exist(self) -> bool:
        """Whether the bucket exists, as far as we may know: True when asking is forbidden (an account
        that may read objects need not see the bucket's metadata)."""
        try:
            with self._errors("read from"):
                return bool(self.bucket.exists(retry=self.retry, timeout=self.timeout_s))
        except CheckpointError:
            return True
