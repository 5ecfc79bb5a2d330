"""Checkpoints that survive a disconnect: written to local disk, copied to Drive or a bucket under a
new name, verified there, and only then recorded; nothing saved is ever written over.

A Colab runtime can disconnect in the middle of ``torch.save(state, "/content/drive/MyDrive/ckpt.pt")``.
The file on Drive is then torn, and it was the only one. :class:`Checkpoints` writes each checkpoint to
the runtime's disk first (fast, and a crash there loses nothing remote), claims a new name at the
destination (its record, ``<name>-<step>.pt.json``, created exclusively and marked pending, with this
process's host and id), copies the checkpoint there as ``<name>-<step>.pt`` (``<name>-<step>.<n>.pt`` when
that step was saved before), checks the copy's CRC32C against the local file, and only then completes the
record. A checkpoint counts only with a whole record, so a disconnect at any moment leaves every
acknowledged save whole and verified, and a second saver on the same destination takes other names.
Records carry a serial number: the latest checkpoint is the one saved last, so restarting from an older
step and saving makes that save the latest. Nothing relies on renaming, which not every FUSE file system
does well. The destinations live in :mod:`~dataferry.checkpoints.destinations`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dataferry.cache.checksum import file_crc
from dataferry.checkpoints.records import RECORD, Claim, Saved, parse_record
from dataferry.checkpoints.destinations import (BucketDestination, CheckpointError, Destination, DestinationFull,
                                                FolderDestination, Listed, LocalWriteFailed, NameTaken)
from dataferry.errors import BadArgument
from dataferry.host import pid_alive
from dataferry.sources.gcs import bucket_name

__all__ = ["Checkpoints", "Saved", "CheckpointError", "CheckpointWarning"]

TEMP = ".dataferry-checkpoint-"  # local copies being written or fetched, in the work folder
TORN_AFTER_S = 60.0  # a record that is not JSON for this long was torn by its writer's end, not being written
FOREIGN_CLAIM_S = 6 * 3600.0  # a save another machine started this long ago ended with it (a disconnect)


class CheckpointWarning(UserWarning):
    """:meth:`Checkpoints.fetch` skipped a damaged or missing checkpoint for an older whole one."""


Record = Saved | Claim | str | None  # what a record says (see parse_record)


def _saves(records: dict[str, Record]) -> dict[str, Saved]:
    """The whole records among ``records``."""
    return {name: r for name, r in records.items() if isinstance(r, Saved)}


def _remove(path: Path) -> None:
    """Remove a local copy, whatever a ``write()`` made of it (a file, or a folder as ``save_pretrained`` makes)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


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
        _remove(Path(name))


def _remove_dead_copies(work: Path) -> None:
    """Remove the local copies (files or folders) of processes that are gone (their id is in the name); a live
    one's stay."""
    with contextlib.suppress(FileNotFoundError):
        for path in work.iterdir():
            pid = path.name.removeprefix(TEMP).split("-", 1)[0]
            if path.name.startswith(TEMP) and pid.isdigit() and not pid_alive(int(pid)):
                _remove(path)


def _plain_name(what: str, value: object, example: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or "\0" in value or value.startswith("."):
        raise BadArgument(f"{what}={value!r}: a checkpoint's {what} is part of a plain file name (no '/', no NUL, "
                          f"not empty, no leading '.'), e.g. {example!r}")
    return value


class Checkpoints:
    """The newest ``keep`` checkpoints in ``dest``: a folder (a Drive folder, a gcsfuse mount, a local
    disk) or ``gs://bucket/prefix`` (written with ``client``, a google-cloud-storage client, whose bucket
    calls are retried for up to ``timeout_s``). Local copies go to ``work`` (default: the system's temp
    folder); what a killed save left there is removed when a :class:`Checkpoints` opens it again.

    A training run saves; any number of processes may read. A second saver on the same destination and
    ``name`` never takes a name the first has taken, but the two share ``keep``."""

    def __init__(self, dest: str | os.PathLike[str], keep: int = 3, *, client: Any = None,
                 name: str = "checkpoint", suffix: str = ".pt", work: str | os.PathLike[str] | None = None,
                 timeout_s: float = 120.0) -> None:
        if type(keep) is not int or keep < 1:
            raise BadArgument(f"keep={keep!r}: keep at least 1, the latest checkpoint is always kept")
        _plain_name("name", name, "checkpoint")
        if not isinstance(suffix, str) or not suffix or "/" in suffix or "\0" in suffix:
            raise BadArgument(f"suffix={suffix!r}: a checkpoint's suffix ends a plain file name (no '/', no NUL, "
                              "not empty), e.g. '.pt'")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise BadArgument(f"timeout_s={timeout_s!r}: give a number of seconds > 0")
        if not isinstance(dest, (str, os.PathLike)) or not str(dest).strip():
            raise BadArgument(f"dest={dest!r}: give a folder or gs://bucket/prefix")
        self.dest, self.keep, self.name, self.suffix = str(dest), keep, name, suffix
        self._ours = re.compile(rf"{re.escape(name)}-(\d{{9,}})(\.[1-9]\d*)?{re.escape(suffix)}({re.escape(RECORD)})?")
        self.work = Path(work) if work else Path(tempfile.gettempdir())
        self._dest = self._destination(client, timeout_s)
        with self._local_errors("make the work folder"):
            self.work.mkdir(parents=True, exist_ok=True)
        _remove_dead_copies(self.work)

    def _destination(self, client: Any, timeout_s: float) -> Destination:
        if not self.dest.startswith("gs://"):
            return FolderDestination(Path(self.dest), self.dest)
        bucket, _, prefix = self.dest[5:].partition("/")
        bucket_name(bucket)
        if client is None:
            from dataferry.sources.gcs import signed_in_client

            client = signed_in_client(f"gs://{bucket}")
        prefix = prefix.strip("/")
        return BucketDestination(client, bucket, prefix + "/" if prefix else "", f"gs://{bucket}/{prefix}",
                                 timeout_s)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, write: Callable[[Path], Any]) -> Saved:
        """Checkpoint ``step``: ``write(path)`` writes it to a local file (e.g. ``lambda p: torch.save(state, p)``);
        it is then copied under a new name, verified and recorded, and becomes the latest; saves older
        than the newest ``keep`` go. A step saved before is saved again beside it, never over it."""
        if type(step) is not int or step < 0:
            raise BadArgument(f"step={step!r}: give a whole number >= 0")
        t0 = time.perf_counter()
        with self._local_errors("write the checkpoint locally"):
            self.work.mkdir(parents=True, exist_ok=True)
        with _local_copy(self.work, self.suffix) as local:
            self._write_locally(write, local)
            with self._local_errors("read back the local copy"):
                size, crc = file_crc(local)
            listed = self._dest.listing(f"{self.name}-")
            records = self._records(listed)  # read once: the claim, the room and the pruning all go by them
            name = self._claim(step, listed)
            c0 = time.perf_counter()
            try:
                self._copy(local, name, crc, size, records, listed)
            except BaseException:
                with contextlib.suppress(Exception):  # the claim goes with the failed copy: nothing stays of it
                    self._dest.delete(name + RECORD)
                raise
            t1 = time.perf_counter()
        serial = max((s.serial for s in _saves(records).values()), default=0) + 1
        saved = Saved(name, step, size, crc, t1 - t0, t1 - c0, serial)
        self._put_text(name + RECORD, json.dumps(asdict(saved)))
        records[name] = saved
        listed[name] = listed[name + RECORD] = Listed(size, None, time.time())
        try:
            self._prune(records, listed)
        except CheckpointError as e:  # saved and recorded all the same: only the clean-up failed
            warnings.warn(f"{name} is saved, but older checkpoints could not be removed: {e}", CheckpointWarning,
                          stacklevel=2)
        return saved

    def _write_locally(self, write: Callable[[Path], Any], local: Path) -> None:
        """``write(local)``, then check that it left one file with something in it."""
        try:
            write(local)
        except OSError as e:
            raise CheckpointError(f"write() could not write the checkpoint to {local} ({e.strerror or e}): check "
                                  "the local disk (is it full?), or pass work= on another; the previous "
                                  "checkpoint stays the latest") from e
        if local.is_dir():
            raise CheckpointError(f"write() made {local} a folder (as save_pretrained does); a checkpoint is one "
                                  "file: write one (torch.save(state, path)), or pack the folder into one (e.g. "
                                  "shutil.make_archive); nothing was saved")
        if not local.is_file() or local.stat().st_size == 0:
            raise CheckpointError(f"write() wrote nothing to the path it was given ({local}): write the checkpoint "
                                  "there, e.g. lambda path: torch.save(state, path); nothing was saved or removed")

    def _claim(self, step: int, listed: dict[str, Listed]) -> str:
        """``<name>-<step>.pt``, or ``<name>-<step>.<n>.pt`` with the first ``n`` whose file and record are free and
        whose record this save creates first (exclusively): a second saver takes the next."""
        stem = f"{self.name}-{step:09d}"
        claim = json.dumps({"pending": True, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
        for n in itertools.count():
            candidate = f"{stem}.{n}{self.suffix}" if n else f"{stem}{self.suffix}"
            if candidate in listed or candidate + RECORD in listed:
                continue
            try:
                self._dest.create_text(candidate + RECORD, claim)
            except NameTaken:
                continue
            return candidate
        raise AssertionError("unreachable")

    def _copy(self, local: Path, name: str, crc: str, size: int, records: dict[str, Record],
              listed: dict[str, Listed]) -> None:
        """Copy ``local`` in as ``name``. A destination too full for it makes room from the saves that are beyond
        ``keep`` once this one is saved, if that is enough, and tries once more; else nothing is removed. What it
        removes leaves ``records`` and ``listed``."""
        try:
            self._dest.copy_in(local, name, crc)
            return
        except NameTaken:
            raise CheckpointError(f"{name} appeared in {self.dest} while this save held its record: another "
                                  "process writes there under this name; give each saver a name= of its own") from None
        except DestinationFull as full:
            doomed = self._beyond(_saves(records), listed, self.keep - 1)
            free = self._dest.free_bytes()
            room = sum(listed[s.name].size for s in doomed if s.name in listed)
            if free is None or not doomed or free + room < size:
                raise DestinationFull(f"{self.dest} is full: {free if free is not None else '?'} bytes free, the "
                                      f"checkpoint needs {size}, and the saves beyond keep={self.keep} hold {room}: free "
                                      "room there, or save elsewhere; the previous checkpoint stays the latest") from full
        for saved in doomed:
            self._drop(saved.name)
            del records[saved.name]
            for gone in (saved.name, saved.name + RECORD):
                listed.pop(gone, None)
        self._dest.copy_in(local, name, crc)

    # -- reading --------------------------------------------------------------------------------

    def latest(self) -> Saved | None:
        """The checkpoint saved last with a whole record, or None before the first save."""
        recorded = self.saved()
        return recorded[-1] if recorded else None

    def _records(self, listed: dict[str, Listed]) -> dict[str, Record]:
        """What each of this set's records says, by checkpoint name."""
        out = {}
        for record in listed:
            match = self._ours.fullmatch(record)
            if match and match.group(3):
                checkpoint = record.removesuffix(RECORD)
                out[checkpoint] = parse_record(checkpoint, self._dest.get_text(record))
        return out

    def saved(self, listed: list[str] | None = None) -> list[Saved]:
        """Every checkpoint with a whole record, in save order (oldest first): a copy torn by a
        disconnect has none, and a record that is torn or names another file does not count."""
        names = self._dest.listing(f"{self.name}-")
        if listed is not None:
            names = {n: names[n] for n in listed if n in names}
        return sorted(_saves(self._records(names)).values(), key=lambda s: s.order)

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
                with open(local, "wb") as out:
                    self._dest.fetch(saved.name, out)
            except (FileNotFoundError, IsADirectoryError):
                return "is missing (deleted since it was saved, or not a file)"
            except LocalWriteFailed as e:
                raise CheckpointError(f"could not write {saved.name} to {folder} on the local disk "
                                      f"({e.error.strerror or e.error}): free room there, or fetch to another "
                                      "folder (to=); the checkpoint in the destination is untouched") from None
            got = file_crc(local)
            if got != (saved.bytes, saved.crc32c):
                return (f"does not match the CRC32C recorded when it was saved ({got[0]} bytes, CRC32C {got[1]}; "
                        f"recorded {saved.bytes}, {saved.crc32c}): it was changed afterwards")
            with self._local_errors("put the fetched checkpoint in place"):
                os.replace(local, folder / saved.name)
        return None

    # -- what stays ------------------------------------------------------------------------------

    def _whole(self, saved: Saved, listed: dict[str, Listed]) -> bool:
        """Whether ``saved``'s file is there in its recorded size (and CRC32C, where the listing gives it)."""
        got = listed.get(saved.name)
        return got is not None and got.size == saved.bytes and got.crc32c in (None, saved.crc32c)

    def _beyond(self, recorded: dict[str, Saved], listed: dict[str, Listed], keep: int) -> list[Saved]:
        """The saves older than the oldest of the newest ``keep`` whole ones (a damaged save does not count)."""
        whole = sorted((s for s in recorded.values() if self._whole(s, listed)), key=lambda s: s.order)
        if keep <= 0:
            return whole
        if len(whole) < keep:
            return []
        oldest = whole[-keep].order
        return sorted((s for s in recorded.values() if s.order < oldest), key=lambda s: s.order)

    def _drop(self, name: str) -> None:
        self._dest.delete(name + RECORD)  # the record first: no record outlives its file
        self._dest.delete(name)

    def _prune(self, records: dict[str, Record], listed: dict[str, Listed]) -> None:
        """Keep the newest ``keep`` whole saves; drop those older (record first), and what saves that ended
        before their record was complete left: a claim of a process gone on this machine (or of another
        machine after ``FOREIGN_CLAIM_S``: a disconnect), a record torn for ``TORN_AFTER_S``, a copy with no
        record. A record that is JSON but not one of ours is left alone, and so is its file. ``records`` and
        ``listed`` are as this save found them, with itself: what another saver wrote since is not touched."""
        for saved in self._beyond(_saves(records), listed, self.keep):
            self._drop(saved.name)
        here, now = socket.gethostname(), time.time()
        for name, record in records.items():
            age = now - listed[name + RECORD].mtime
            if (isinstance(record, Claim) and ((record.host == here and not pid_alive(record.pid))
                                                or (record.host != here and now - record.started > FOREIGN_CLAIM_S))
                    or (record == "torn" and age > TORN_AFTER_S)):
                self._drop(name)
        for name in listed:
            match = self._ours.fullmatch(name)
            if match and not match.group(3) and name not in records and self._dest.get_text(name + RECORD) is None:
                self._dest.delete(name)  # a copy whose save ended before it made a record (an older version's)

    def _put_text(self, name: str, text: str) -> None:
        self._dest.put_text(name, text)

    def _get_text(self, name: str) -> str | None:
        return self._dest.get_text(name)

    @contextlib.contextmanager
    def _local_errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise CheckpointError(f"could not {doing} ({e.strerror or e}{': ' + e.filename if e.filename else ''}): "
                                  "check the local disk (is it full? is the work folder writable?); the previous "
                                  "checkpoint stays the latest") from None

    def __repr__(self) -> str:
        return f"<Checkpoints {self.dest} keep={self.keep}>"
