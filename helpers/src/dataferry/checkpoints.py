"""Checkpoints that survive a disconnect: written to local disk, copied to Drive or a bucket under a
new name, verified there, and only then recorded; nothing saved is ever written over.

A Colab runtime can disconnect in the middle of ``torch.save(state, "/content/drive/MyDrive/ckpt.pt")``.
The file on Drive is then torn, and it was the only one. :class:`Checkpoints` writes each checkpoint to
the runtime's disk first (fast, and a crash there loses nothing remote), copies it to the destination as
``<name>-<step>.pt`` (``<name>-<step>.<n>.pt`` when that step was saved before: a new name, whatever
happens), checks the copy's CRC32C against the local file, and only then writes its record,
``<name>-<step>.pt.json``, also under a new name. A checkpoint counts only with a whole record, so a
disconnect at any moment leaves every acknowledged save whole and verified. Records carry a serial
number: the latest checkpoint is the one saved last, so restarting from an older step and saving makes
that save the latest. Nothing relies on renaming, which not every FUSE file system does well.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dataferry.cache.checksum import file_crc
from dataferry.errors import BadArgument, DataferryError
from dataferry.host import pid_alive

__all__ = ["Checkpoints", "Saved", "CheckpointError", "CheckpointWarning"]

RECORD = ".json"  # beside each checkpoint, written last: its step, size, CRC32C and serial
TEMP = ".dataferry-checkpoint-"  # local copies being written or fetched, in the work folder


class CheckpointError(DataferryError, RuntimeError):
    """A checkpoint could not be written, verified or found; the message says which and what to do."""


class CheckpointWarning(UserWarning):
    """:meth:`Checkpoints.fetch` skipped a damaged or missing checkpoint for an older whole one."""


@dataclass(frozen=True)
class Saved:
    """One checkpoint at the destination: its name, step, size, CRC32C (base64, as GCS gives it), how
    long saving it took, in all and copying it (``copy_s``) after the local write, and its ``serial``
    (saves are numbered 1, 2, ...; records written before serials existed have 0)."""

    name: str
    step: int
    bytes: int
    crc32c: str
    seconds: float = 0.0
    copy_s: float = 0.0
    serial: int = 0

    @property
    def order(self) -> tuple[int, int]:
        """Save order: by serial, then by step (records without a serial)."""
        return self.serial, self.step


def _parse_record(checkpoint: str, text: str | None) -> Saved | None:
    """The record of ``checkpoint`` if it is whole and names it; a torn or foreign record is None."""
    try:
        fields = json.loads(text or "")
        saved = Saved(**fields)
    except (ValueError, TypeError):
        return None
    ints = (saved.step, saved.bytes, saved.serial)
    if saved.name != checkpoint or not all(type(n) is int and n >= 0 for n in ints):
        return None
    if not isinstance(saved.crc32c, str) or not all(isinstance(t, (int, float)) for t in (saved.seconds, saved.copy_s)):
        return None
    return saved


@contextlib.contextmanager
def _local_copy(work: Path, suffix: str) -> Iterator[Path]:
    """A new file in ``work`` for one save or fetch, named with this process's id and removed afterwards.
    What a killed process left there is removed by :func:`_remove_dead_copies`."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"{TEMP}{os.getpid()}-", suffix=suffix, dir=work)
        os.close(fd)
    except OSError as e:
        raise CheckpointError(f"could not make a local copy in {work} ({e.strerror or e}): check the local disk "
                              "(is it full? is the folder writable?); the previous checkpoint stays the latest") from None
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _remove_dead_copies(work: Path) -> None:
    """Remove the local copies of processes that are gone (their id is in the name); a live one's stay."""
    with contextlib.suppress(FileNotFoundError):
        for path in work.iterdir():
            pid = path.name.removeprefix(TEMP).split("-", 1)[0]
            if path.name.startswith(TEMP) and pid.isdigit() and not pid_alive(int(pid)):
                path.unlink(missing_ok=True)


class Checkpoints:
    """The newest ``keep`` checkpoints in ``dest``: a folder (a Drive folder, a gcsfuse mount, a local
    disk) or ``gs://bucket/prefix`` (written with ``client``, a google-cloud-storage client, whose bucket
    calls are retried for up to ``timeout_s``). Local copies go to ``work`` (default: the system's temp
    folder); what a killed save left there is removed when a :class:`Checkpoints` opens it again.

    One process saves to a destination at a time (a training run); any number may read it."""

    def __init__(self, dest: str | os.PathLike[str], keep: int = 3, *, client: Any = None,
                 name: str = "checkpoint", suffix: str = ".pt", work: str | os.PathLike[str] | None = None,
                 timeout_s: float = 120.0) -> None:
        if type(keep) is not int or keep < 1:
            raise BadArgument(f"keep={keep!r}: keep at least 1, the latest checkpoint is always kept")
        if not name or "/" in name or name.startswith("."):
            raise BadArgument(f"name={name!r}: a checkpoint's name is a plain file name, e.g. 'checkpoint'")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise BadArgument(f"timeout_s={timeout_s!r}: give a number of seconds > 0")
        self.dest, self.keep, self.name, self.suffix = str(dest), keep, name, suffix
        self._ours = re.compile(rf"{re.escape(name)}-(\d{{9,}})(\.[1-9]\d*)?{re.escape(suffix)}({re.escape(RECORD)})?")
        self.work = Path(work) if work else Path(tempfile.gettempdir())
        self._bucket: Any = None
        self._prefix, self._folder = "", None
        if self.dest.startswith("gs://"):
            from google.cloud.storage.retry import DEFAULT_RETRY

            bucket, _, prefix = self.dest[5:].partition("/")
            if client is None:
                from dataferry.sources.gcs import signed_in_client

                client = signed_in_client(bucket)
            prefix = prefix.strip("/")
            self._bucket, self._prefix = client.bucket(bucket), prefix + "/" if prefix else ""
            self._retry, self._timeout_s = DEFAULT_RETRY.with_timeout(timeout_s), timeout_s
        else:
            self._folder = Path(dest)
            with self._folder_errors("create"):
                self._folder.mkdir(parents=True, exist_ok=True)
        with self._local_errors("make the work folder"):
            self.work.mkdir(parents=True, exist_ok=True)
        _remove_dead_copies(self.work)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, write: Callable[[Path], Any]) -> Saved:
        """Checkpoint ``step``: ``write(path)`` writes it to a local file (e.g. ``lambda p: torch.save(state, p)``);
        it is then copied under a new name, verified and recorded, and becomes the latest; saves older
        than the newest ``keep`` go. A step saved before is saved again beside it, never over it."""
        if type(step) is not int or step < 0:
            raise BadArgument(f"step={step!r}: give a whole number >= 0")
        t0 = time.perf_counter()
        listed = self._listing()
        recorded = self.saved(listed)
        name = self._new_name(step, set(listed))
        serial = max((s.serial for s in recorded), default=0) + 1
        with self._local_errors("write the checkpoint locally"):
            self.work.mkdir(parents=True, exist_ok=True)
        with _local_copy(self.work, self.suffix) as local:
            write(local)
            with self._local_errors("read back the local copy"):
                size, crc = file_crc(local)
            c0 = time.perf_counter()
            self._copy(local, name, crc)
            t1 = time.perf_counter()
        saved = Saved(name, step, size, crc, t1 - t0, t1 - c0, serial)
        self._put_text(name + RECORD, json.dumps(asdict(saved)))
        try:
            self._prune([*recorded, saved], set(listed) | {name, name + RECORD})
        except CheckpointError as e:  # saved and recorded all the same: only the clean-up failed
            warnings.warn(f"{name} is saved, but older checkpoints could not be removed: {e}", CheckpointWarning,
                          stacklevel=2)
        return saved

    def _new_name(self, step: int, taken: set[str]) -> str:
        """``<name>-<step>.pt``, or ``<name>-<step>.<n>.pt`` with the first ``n`` whose file and record are free."""
        stem = f"{self.name}-{step:09d}"
        for n in itertools.count():
            candidate = f"{stem}.{n}{self.suffix}" if n else f"{stem}{self.suffix}"
            if candidate not in taken and candidate + RECORD not in taken:
                return candidate
        raise AssertionError("unreachable")

    # -- reading --------------------------------------------------------------------------------

    def latest(self) -> Saved | None:
        """The checkpoint saved last with a whole record, or None before the first save."""
        recorded = self.saved()
        return recorded[-1] if recorded else None

    def saved(self, listed: list[str] | None = None) -> list[Saved]:
        """Every checkpoint with a whole record, in save order (oldest first): a copy torn by a
        disconnect has none, and a record that is torn or names another file does not count.
        ``listed``: the destination's names when the caller has just listed them."""
        names = self._listing() if listed is None else listed
        out = []
        for record in names:
            if record.endswith(RECORD) and self._ours.fullmatch(record):
                saved = _parse_record(record.removesuffix(RECORD), self._get_text(record))
                if saved is not None:
                    out.append(saved)
        return sorted(out, key=lambda s: s.order)

    def names(self) -> list[str]:
        """Names of the recorded checkpoints, oldest first."""
        return [s.name for s in self.saved()]

    def fetch(self, to: str | os.PathLike[str] | None = None) -> Path:
        """The latest whole checkpoint as a local file (under ``to``, default the work folder), checked against
        its CRC32C; load it with e.g. ``torch.load(ckpt.fetch())``. One that is missing or fails its check is
        skipped for the one saved before it, with a :class:`CheckpointWarning`; none whole is a
        :class:`CheckpointError`."""
        recorded = self.saved()
        if not recorded:
            raise CheckpointError(f"no checkpoint in {self.dest} yet: nothing to resume from")
        folder = Path(to or self.work)
        with self._local_errors("make the folder to fetch into"):
            folder.mkdir(parents=True, exist_ok=True)
        skipped: list[str] = []
        for saved in reversed(recorded):
            problem = self._fetch_one(saved, folder)
            if problem is None:
                if skipped:
                    warnings.warn(f"{'; '.join(skipped)}: fetched {saved.name} (step {saved.step}) instead",
                                  CheckpointWarning, stacklevel=2)
                return folder / saved.name
            skipped.append(f"{saved.name} {problem}")
        raise CheckpointError(f"no checkpoint in {self.dest} is whole: {'; '.join(skipped)}. Nothing was deleted; "
                              "resume from scratch or restore a copy")

    def _fetch_one(self, saved: Saved, folder: Path) -> str | None:
        """Fetch ``saved`` to ``folder`` through a local copy, put in place only once it checks out;
        None when it did, else what is wrong with it."""
        with _local_copy(folder, self.suffix) as local:
            try:
                if self._folder is not None:
                    with self._folder_errors("read"):
                        shutil.copyfile(self._folder / saved.name, local)
                else:
                    self._download(saved.name, local)
            except (FileNotFoundError, IsADirectoryError):
                return "is missing (deleted since it was saved, or not a file)"
            got = file_crc(local)
            if got != (saved.bytes, saved.crc32c):
                return (f"does not match the CRC32C recorded when it was saved ({got[0]} bytes, CRC32C {got[1]}; "
                        f"recorded {saved.bytes}, {saved.crc32c}): it was changed afterwards")
            with self._local_errors("put the fetched checkpoint in place"):
                os.replace(local, folder / saved.name)
        return None

    # -- the destination ------------------------------------------------------------------------

    def _listing(self) -> list[str]:
        """The names of this set's checkpoints and records at the destination (not another name's)."""
        head = f"{self.name}-"
        if self._folder is not None:
            with self._folder_errors("list"):
                names = [p.name for p in self._folder.iterdir() if p.name.startswith(head)]
        else:
            with self._bucket_errors("list"):
                names = [b.name[len(self._prefix):] for b in self._bucket.list_blobs(
                    prefix=self._prefix + head, retry=self._retry, timeout=self._timeout_s)]
        return sorted(n for n in names if self._ours.fullmatch(n))

    def _copy(self, local: Path, name: str, crc: str) -> None:
        if self._folder is not None:
            with self._folder_errors("write"):
                shutil.copyfile(local, self._folder / name)
                got = file_crc(self._folder / name)[1]  # read back through the mount: what landed, not what was sent
            if got != crc:
                raise CheckpointError(f"the copy of {name} in {self.dest} reads back wrong (CRC32C {got}, "
                                      f"expected {crc}): the destination is failing; the previous checkpoint stays")
            return
        blob = self._bucket.blob(self._prefix + name)
        with self._bucket_errors("save to"):
            blob.upload_from_filename(str(local), checksum="crc32c", timeout=self._timeout_s)
            blob.reload(retry=self._retry, timeout=self._timeout_s)
        if blob.crc32c != crc:
            raise CheckpointError(f"gs://{self._bucket.name}/{self._prefix}{name} holds CRC32C {blob.crc32c}, "
                                  f"expected {crc}: the previous checkpoint stays the latest")

    def _download(self, name: str, local: Path) -> None:
        """Download ``name`` to ``local``; FileNotFoundError when it is gone."""
        from google.api_core.exceptions import NotFound

        try:
            with self._bucket_errors("read from", missing=NotFound):
                self._bucket.blob(self._prefix + name).download_to_filename(
                    str(local), retry=self._retry, timeout=self._timeout_s)
        except NotFound:
            raise FileNotFoundError(name) from None

    def _put_text(self, name: str, text: str) -> None:
        if self._folder is not None:
            with self._folder_errors("write"):
                (self._folder / name).write_text(text)
            return
        with self._bucket_errors("save to"):
            self._bucket.blob(self._prefix + name).upload_from_string(text, content_type="application/json",
                                                                      timeout=self._timeout_s)

    def _get_text(self, name: str) -> str | None:
        """A record's text; None when it is gone, is not a file or is not text."""
        if self._folder is not None:
            try:
                with self._folder_errors("read"):
                    return (self._folder / name).read_bytes().decode()
            except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
                return None
        from google.api_core.exceptions import NotFound

        try:
            with self._bucket_errors("read from", missing=NotFound):
                return self._bucket.blob(self._prefix + name).download_as_bytes(
                    retry=self._retry, timeout=self._timeout_s).decode()
        except (NotFound, UnicodeDecodeError):
            return None

    def _delete(self, name: str) -> None:
        if self._folder is not None:
            with self._folder_errors("delete from"):
                (self._folder / name).unlink(missing_ok=True)
            return
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound), self._bucket_errors("delete from", missing=NotFound):
            self._bucket.blob(self._prefix + name).delete(retry=self._retry, timeout=self._timeout_s)

    def _prune(self, recorded: list[Saved], listed: set[str]) -> None:
        """Keep the newest ``keep`` saves; drop older ones (the record first, so no record outlives its
        file) and every copy a disconnect tore (one process saves to a destination at a time)."""
        keep = {s.name for s in sorted(recorded, key=lambda s: s.order)[-self.keep:]}
        for name in sorted(listed, key=lambda n: not n.endswith(RECORD)):  # records first
            if name.removesuffix(RECORD) not in keep:
                self._delete(name)

    # -- errors ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _folder_errors(self, doing: str) -> Iterator[None]:
        """An OSError of the destination folder as a :class:`CheckpointError` (a missing file stays one)."""
        try:
            yield
        except (FileNotFoundError, IsADirectoryError):
            if doing in ("read", "delete from"):
                raise
            raise CheckpointError(f"cannot {doing} {self.dest}: it does not exist, or a part of the path is "
                                  "missing (is Drive still mounted?); nothing was changed") from None
        except OSError as e:
            raise CheckpointError(f"cannot {doing} {self.dest} ({e.strerror or e}): check the folder "
                                  "(is Drive still mounted? is the disk full?); the previous checkpoint "
                                  "stays the latest") from None

    @contextlib.contextmanager
    def _local_errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise CheckpointError(f"could not {doing} ({e.strerror or e}{': ' + e.filename if e.filename else ''}): "
                                  "check the local disk (is it full? is the work folder writable?); the previous "
                                  "checkpoint stays the latest") from None

    @contextlib.contextmanager
    def _bucket_errors(self, doing: str, missing: type[BaseException] | None = None) -> Iterator[None]:
        """google-cloud-storage's errors as one :class:`CheckpointError` line; ``missing`` (an object's
        NotFound) passes through when the bucket itself exists."""
        from google.api_core.exceptions import Forbidden, GoogleAPIError, NotFound, RetryError
        from google.auth.exceptions import GoogleAuthError, TransportError
        from requests.exceptions import RequestException

        try:
            from google.cloud.storage.exceptions import DataCorruption
        except ImportError:  # google-cloud-storage < 3
            from google.resumable_media import DataCorruption  # type: ignore[no-redef]

        where = f"gs://{self._bucket.name}"
        try:
            yield
        except NotFound:
            if missing is not None and self._bucket_may_exist():
                raise
            raise CheckpointError(f"bucket {where} does not exist (or you may not use it): check the name; "
                                  "nothing was changed") from None
        except Forbidden as e:
            raise CheckpointError(f"you may not {doing} {where} ({e.message}): sign in with an account that may, "
                                  "or choose a bucket of your own") from None
        except (RetryError, RequestException, ConnectionError, TimeoutError, TransportError) as e:
            raise CheckpointError(f"could not reach {where} to {doing} it within {self._timeout_s:g} s "
                                  f"({e.__class__.__name__}): check the network or the endpoint; the previous "
                                  "checkpoint stays the latest") from None
        except (GoogleAPIError, GoogleAuthError, DataCorruption) as e:
            raise CheckpointError(f"could not {doing} {where} ({e.__class__.__name__}: {e}); the previous "
                                  "checkpoint stays the latest") from None

    def _bucket_may_exist(self) -> bool:
        """Whether the bucket exists, as far as we may know: True when asking is forbidden (an account
        that may read objects need not see the bucket's metadata)."""
        try:
            with self._bucket_errors("read from"):
                return bool(self._bucket.exists(retry=self._retry, timeout=self._timeout_s))
        except CheckpointError:
            return True

    def __repr__(self) -> str:
        return f"<Checkpoints {self.dest} keep={self.keep}>"
