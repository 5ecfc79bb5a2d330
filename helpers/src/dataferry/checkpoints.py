"""Checkpoints that survive a disconnect: written to local disk, copied to Drive or a bucket under a
new name, verified there, and only then recorded; the last good one is never overwritten.

A Colab runtime can disconnect in the middle of ``torch.save(state, "/content/drive/MyDrive/ckpt.pt")``.
The file on Drive is then torn, and it was the only one. :class:`Checkpoints` writes each checkpoint to
the runtime's disk first (fast, and a crash there loses nothing remote), copies it to the destination as
``<name>-<step>.pt`` (a new name: nothing is overwritten), checks the copy's CRC32C against the local
file, and only then writes its record, ``<name>-<step>.pt.json``. A checkpoint counts only with a whole
record, so a disconnect at any moment leaves the newest recorded checkpoint whole and verified. Nothing
relies on renaming, which not every FUSE file system does well.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dataferry.cache.checksum import file_crc

__all__ = ["Checkpoints", "Saved", "CheckpointError"]

RECORD = ".json"  # beside each checkpoint, written last: its step, size and CRC32C


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, verified or found; the message says which and what to do."""


@dataclass(frozen=True)
class Saved:
    """One checkpoint at the destination: its name, step, size, CRC32C (base64, as GCS gives it) and how
    long saving it took, in all and copying it (``copy_s``) after the local write."""

    name: str
    step: int
    bytes: int
    crc32c: str
    seconds: float = 0.0
    copy_s: float = 0.0


class Checkpoints:
    """The newest ``keep`` checkpoints in ``dest``: a folder (a Drive folder, a gcsfuse mount, a local
    disk) or ``gs://bucket/prefix`` (written with ``client``, a google-cloud-storage client)."""

    def __init__(self, dest: str | os.PathLike[str], keep: int = 3, *, client: Any = None,
                 name: str = "checkpoint", suffix: str = ".pt", work: str | os.PathLike[str] | None = None) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1: the latest checkpoint is always kept")
        self.dest, self.keep, self.name, self.suffix = str(dest), keep, name, suffix
        self.work = Path(work) if work else Path(tempfile.gettempdir())
        if self.dest.startswith("gs://"):
            bucket, _, prefix = self.dest[5:].partition("/")
            if client is None:
                from google.cloud import storage

                client = storage.Client()
            prefix = prefix.strip("/")
            self._bucket, self._prefix, self._folder = client.bucket(bucket), prefix + "/" if prefix else "", None
        else:
            self._bucket, self._prefix, self._folder = None, "", Path(dest)
            self._folder.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, write: Callable[[Path], Any]) -> Saved:
        """Checkpoint ``step``: ``write(path)`` writes it to a local file (e.g. ``lambda p: torch.save(state, p)``);
        it is then copied, verified and recorded, and checkpoints older than the newest ``keep`` go."""
        t0 = time.perf_counter()
        self.work.mkdir(parents=True, exist_ok=True)
        local = Path(tempfile.mkstemp(prefix=f"{self.name}-", suffix=self.suffix, dir=self.work)[1])
        try:
            write(local)
            size, crc = file_crc(local)
            name = f"{self.name}-{step:09d}{self.suffix}"
            c0 = time.perf_counter()
            self._copy(local, name, crc)
            t1 = time.perf_counter()
            saved = Saved(name, step, size, crc, t1 - t0, t1 - c0)
        finally:
            local.unlink(missing_ok=True)
        self._put_text(name + RECORD, json.dumps(asdict(saved)))
        self._prune()
        return saved

    def latest(self) -> Saved | None:
        """The newest checkpoint with a whole record, or None before the first save."""
        recorded = self.saved()
        return recorded[-1] if recorded else None

    def saved(self, listed: list[str] | None = None) -> list[Saved]:
        """Every checkpoint with a whole record, oldest first: a copy torn by a disconnect has none.
        ``listed``: the destination's names when the caller has just listed them."""
        out = []
        for name in self._listing() if listed is None else listed:
            if name.endswith(self.suffix + RECORD):
                try:
                    out.append(Saved(**json.loads(self._get_text(name) or "")))
                except (ValueError, TypeError):
                    continue  # a record torn while it was written: its checkpoint does not count
        return sorted(out, key=lambda s: s.step)

    def names(self) -> list[str]:
        """Names of the recorded checkpoints, oldest first."""
        return [s.name for s in self.saved()]

    def fetch(self, to: str | os.PathLike[str] | None = None) -> Path:
        """The latest checkpoint as a local file (under ``to``, default the work folder), checked against its
        CRC32C; load it with e.g. ``torch.load(ckpt.fetch())``."""
        saved = self.latest()
        if saved is None:
            raise CheckpointError(f"no checkpoint in {self.dest} yet: nothing to resume from")
        local = Path(to or self.work) / saved.name
        local.parent.mkdir(parents=True, exist_ok=True)
        if self._folder is not None:
            shutil.copyfile(self._folder / saved.name, local)
        else:
            self._bucket.blob(self._prefix + saved.name).download_to_filename(str(local))
        if file_crc(local)[1] != saved.crc32c:
            local.unlink()
            raise CheckpointError(f"{saved.name} in {self.dest} does not match the CRC32C recorded when it was "
                                  "saved: it was changed afterwards")
        return local

    def _listing(self) -> list[str]:
        head = f"{self.name}-"
        if self._folder is not None:
            return sorted(p.name for p in self._folder.iterdir() if p.name.startswith(head))
        return sorted(b.name[len(self._prefix):] for b in self._bucket.list_blobs(prefix=self._prefix + head))

    def _copy(self, local: Path, name: str, crc: str) -> None:
        if self._folder is not None:
            shutil.copyfile(local, self._folder / name)
            got = file_crc(self._folder / name)[1]  # read back through the mount: what landed, not what was sent
            if got != crc:
                raise CheckpointError(f"the copy of {name} in {self.dest} reads back wrong (CRC32C {got}, "
                                      f"expected {crc}): the destination is failing; the previous checkpoint stays")
            return
        from google.api_core.exceptions import GoogleAPIError, NotFound

        blob = self._bucket.blob(self._prefix + name)
        try:
            blob.upload_from_filename(str(local), checksum="crc32c")
            blob.reload()
        except NotFound:
            raise CheckpointError(f"bucket gs://{self._bucket.name} does not exist (or you may not write to it): "
                                  "check the name; nothing was saved") from None
        except GoogleAPIError as e:
            raise CheckpointError(f"saving {name} to {self.dest} failed ({e.__class__.__name__}: {e}); "
                                  "the previous checkpoint stays the latest") from None
        if blob.crc32c != crc:
            raise CheckpointError(f"gs://{self._bucket.name}/{self._prefix}{name} holds CRC32C {blob.crc32c}, "
                                  f"expected {crc}: the previous checkpoint stays the latest")

    def _put_text(self, name: str, text: str) -> None:
        if self._folder is not None:
            (self._folder / name).write_text(text)
        else:
            self._bucket.blob(self._prefix + name).upload_from_string(text, content_type="application/json")

    def _get_text(self, name: str) -> str | None:
        if self._folder is not None:
            path = self._folder / name
            return path.read_text() if path.exists() else None
        from google.api_core.exceptions import NotFound

        try:
            return self._bucket.blob(self._prefix + name).download_as_text()
        except NotFound:
            return None

    def _prune(self) -> None:
        """Keep the newest ``keep`` recorded checkpoints; drop older ones and copies a disconnect tore."""
        listed = self._listing()
        recorded = self.saved(listed)
        keep = {s.name for s in recorded[-self.keep:]}
        newest = recorded[-1].step if recorded else -1
        for name in listed:
            checkpoint = name.removesuffix(RECORD)
            if checkpoint in keep:
                continue
            step = checkpoint.removeprefix(f"{self.name}-").removesuffix(self.suffix)
            if step.isdigit() and int(step) > newest:
                continue  # a save still under way in another process, perhaps: not ours to delete
            if self._folder is not None:
                (self._folder / name).unlink(missing_ok=True)
            else:
                self._bucket.blob(self._prefix + name).delete()

    def __repr__(self) -> str:
        return f"<Checkpoints {self.dest} keep={self.keep}>"
