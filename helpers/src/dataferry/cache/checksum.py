"""CRC32C as GCS gives it (base64 of the big-endian value), of files and of ranges joined.

:func:`combine` joins the checksums of consecutive byte ranges (zlib's ``crc32_combine`` method,
with the Castagnoli polynomial), so an object downloaded in parallel ranges is checked against
its stored CRC32C without reading it again.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import BinaryIO

import google_crc32c

from dataferry.cache.layout import CHUNK

__all__ = ["b64", "file_crc", "stream_crc", "combine", "value"]

_POLY = 0x82F63B78  # CRC-32C, reflected


def b64(checksum: google_crc32c.Checksum | int) -> str:
    """The base64 form GCS uses, of a running checksum or a 32-bit value."""
    raw = checksum.to_bytes(4, "big") if isinstance(checksum, int) else checksum.digest()
    return base64.b64encode(raw).decode()


def value(checksum: google_crc32c.Checksum) -> int:
    return int.from_bytes(checksum.digest(), "big")


def file_crc(path: Path) -> tuple[int, str]:
    """(size, base64 CRC32C) of a file, read in chunks."""
    with open(path, "rb") as f:
        return stream_crc(f)


def stream_crc(f: BinaryIO) -> tuple[int, str]:
    """(bytes, base64 CRC32C) of what is left to read in an open file, read in chunks."""
    c, n = google_crc32c.Checksum(), 0
    while chunk := f.read(CHUNK):
        c.update(chunk)
        n += len(chunk)
    return n, b64(c)


def _times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _square(matrix: list[int]) -> list[int]:
    return [_times(matrix, row) for row in matrix]


def _zero_operators() -> list[list[int]]:
    """Operators that advance a CRC over 2**i zero bytes, i = 0..63 (made once)."""
    op = [_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        op = _square(op)  # 2, 4, then 8 zero bits: one zero byte
    ops = [op]
    for _ in range(63):
        ops.append(_square(ops[-1]))
    return ops


_ZEROS: list[list[int]] = []


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of A + B from crc(A), crc(B) and len(B) (zlib's ``crc32_combine`` method): crc1
    is advanced over len2 zero bytes by one GF(2) operator per set bit of len2, then xored with crc2."""
    if not _ZEROS:
        _ZEROS.extend(_zero_operators())
    i = 0
    while len2 > 0:
        if len2 & 1:
            crc1 = _times(_ZEROS[i], crc1)
        len2 >>= 1
        i += 1
    return crc1 ^ crc2
