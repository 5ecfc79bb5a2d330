"""Decoding images: the decoders a DataLoader worker can use (:data:`DECODERS`), and decode once, what a
later epoch should not pay again, kept in the cache beside the bytes it came from.

Once the files are on local disk, JPEG decoding is what holds training back (one core decodes and
augments a 500x375 flower in ~3.75 ms, so a 2-vCPU Colab runtime feeds a few hundred images per
second, whatever the storage). :class:`DecodedImages` is a source whose objects are another
source's images decoded once, at a reduced size (``size`` x ``size`` RGB, shorter side resized and
centre-cropped; JPEGs decoded straight at a fraction of their size with PIL's draft mode), as raw
uint8 pixels. Read through a :class:`~dataferry.Cache`, each is decoded on its first read and kept
as an entry like any other: verified by CRC32C, under the budget, and keyed by the source object's
version and the decoding's identity, so a changed image or another ``size`` is decoded afresh.
Random crops and flips then run on the tensor (cheap), not on the JPEG.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from dataferry.cache import Cache
from dataferry.errors import BadArgument
from dataferry.sources import Entry, Source

__all__ = ["DECODERS", "DecodedImages", "decode_image", "pil_loader", "pil_reduced", "pixels", "torchvision_decode"]

_VERSION = 1  # of the decoding below: a change to it must change every derived key


def pil_loader(data: bytes) -> Any:
    """An image's bytes as an RGB ``PIL.Image`` (what torchvision's ``default_loader`` does with a path)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def pil_reduced(data: bytes, size: int = 224) -> Any:
    """:func:`pil_loader`, but a JPEG is decoded at 1/2, 1/4 or 1/8 of its size when that still covers
    ``size`` x ``size`` (PIL's draft mode: libjpeg's DCT scaling). Photos only twice the crop or less
    (the flowers' 500 x 375 for a 224 crop) decode at full size: there is nothing to save."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if img.format == "JPEG":
            img.draft("RGB", (size, size))
        return img.convert("RGB")


def torchvision_decode(data: bytes) -> Any:
    """An image's bytes as a ``3 x H x W`` uint8 RGB tensor, decoded by ``torchvision.io.decode_image``
    (libjpeg-turbo for JPEGs, without a PIL image in between)."""
    import torch
    from torchvision.io import ImageReadMode, decode_image as tv_decode_image

    return tv_decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


#: The ways a DataLoader worker can decode an image, by name (each a picklable module-level function).
DECODERS: dict[str, Callable[[bytes], Any]] = {"pil": pil_loader, "pil-reduced": pil_reduced,
                                               "torchvision": torchvision_decode}


def decode_image(data: bytes, size: int, draft: bool = True) -> bytes:
    """An image's bytes -> ``size`` x ``size`` x 3 uint8 RGB pixels (row-major, HWC): shorter side resized
    to ``size`` (antialiased), then centre-cropped. ``draft``: let a JPEG decode at 1/2, 1/4 or 1/8 of its
    size when that is still at least ``size`` (libjpeg's DCT scaling; far less work for large photos)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if draft and img.format == "JPEG":
            img.draft("RGB", (size, size))
        rgb = img.convert("RGB")
    w, h = rgb.size
    scale = size / min(w, h)
    rw, rh = max(size, round(w * scale)), max(size, round(h * scale))
    left, top = (rw - size) // 2, (rh - size) // 2
    return rgb.resize((rw, rh), Image.Resampling.BILINEAR, reducing_gap=None).crop(
        (left, top, left + size, top + size)).tobytes()


def pixels(data: bytes, size: int) -> Any:
    """Raw pixels from :func:`decode_image` as a ``3 x size x size`` uint8 tensor (what torchvision's v2
    transforms take)."""
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(size, size, 3).permute(2, 0, 1)


class DecodedImages:
    """The images of ``source`` decoded once to ``size`` x ``size`` RGB (see :func:`decode_image`), read
    through ``cache``: a :class:`~dataferry.sources.Source` whose object ``name`` is the pixels of
    ``source``'s ``name``. Its entries come from :meth:`entry` (an entry of ``source`` -> the derived one);
    each version names the source object's version and this decoding, so neither is ever served stale.

        decoded = DecodedImages(source, cache, size=256)
        data = cache.read_verified(decoded, decoded.entry(source.stat("roses/1.jpg")))   # decoded once
    """

    def __init__(self, source: Source, cache: Cache, size: int = 256, *, draft: bool = True) -> None:
        if type(size) is not int or not 16 <= size <= 4096:
            raise BadArgument(f"size={size!r}: give the decoded side in pixels, 16 to 4096 (e.g. 256 for 224 crops)")
        self.source, self.cache, self.size, self.draft = source, cache, size, draft
        self.identity = f"rgb{size}{'-draft' if draft else ''}-v{_VERSION}"
        self.uri = f"{source.uri.rstrip('/')}/#decoded-{self.identity}"

    @property
    def sample_bytes(self) -> int:
        return 3 * self.size * self.size

    def entry(self, original: Entry) -> Entry:
        """The derived entry of a ``source`` entry: its name, the pixels' size, a version naming both."""
        version = f"{self.identity}|{original.size}|{original.crc32c or ''}|{original.version}"
        return Entry(original.name, self.sample_bytes, version)

    def _original(self, entry: Entry) -> Entry:
        identity, size, crc, version = entry.version.split("|", 3)
        if identity != self.identity:
            raise BadArgument(f"{entry.name}: an entry of another decoding ({identity}), not {self.identity}")
        return Entry(entry.name, int(size), version, crc or None)

    def list(self) -> Iterator[Entry]:
        return (self.entry(e) for e in self.source.list())

    def stat(self, name: str) -> Entry:
        return self.entry(self.source.stat(name))

    def fetch(self, entry: Entry, out: BinaryIO, start: int = 0, timeout: float | None = None) -> int:
        """Decode the source object (its bytes read through the cache, so they are cached too) and write
        the pixels from ``start``."""
        data = decode_image(self.cache.read_verified(self.source, self._original(entry)), self.size, self.draft)
        out.write(data[start:] if start else data)
        return len(data) - start

    def __repr__(self) -> str:
        return f"DecodedImages({self.source!r}, size={self.size}{'' if self.draft else ', draft=False'})"
