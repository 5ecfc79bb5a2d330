"""A checkpoint's record: what a whole save says of itself (:class:`Saved`), what a save in progress says
(:class:`Claim`), and reading either back from text that a disconnect or a person may have changed."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

__all__ = ["RECORD", "Saved", "Claim", "parse_record"]

RECORD = ".json"  # beside each checkpoint, completed last: its step, size, CRC32C and serial


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
    def order(self) -> tuple[int, int, str]:
        """Save order: by serial, then by step (records without a serial), then by name."""
        return self.serial, self.step, self.name


@dataclass(frozen=True)
class Claim:
    """A save in progress (or ended before its record was completed): who started it, and when."""

    host: str
    pid: int
    started: float


_FIELDS = {f.name for f in fields(Saved)}


def parse_record(checkpoint: str, text: str | None) -> Saved | Claim | str | None:
    """What the record of ``checkpoint`` says: a whole :class:`Saved` that names it, a :class:`Claim` of a save
    in progress, "torn" when it is not JSON (a writer that ended mid-way), or None when it is JSON that is not one
    of ours (left alone). Keys it does not know are ignored, as a reader of a newer version's records should."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return "torn"
    if not isinstance(data, dict):
        return None
    if data.get("pending") is True:
        host, pid, started = data.get("host"), data.get("pid"), data.get("started")
        if isinstance(host, str) and type(pid) is int and isinstance(started, (int, float)):
            return Claim(host, pid, float(started))
        return None
    try:
        saved = Saved(**{k: v for k, v in data.items() if k in _FIELDS})
    except TypeError:
        return None
    ints = (saved.step, saved.bytes, saved.serial)
    if saved.name != checkpoint or not all(type(n) is int and n >= 0 for n in ints):
        return None
    if not isinstance(saved.crc32c, str) or not all(isinstance(t, (int, float)) for t in (saved.seconds, saved.copy_s)):
        return None
    return saved
