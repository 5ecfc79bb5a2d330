"""Decoding images: the decoders a DataLoader worker can use (:data:`DECODERS`), and decode once, what a
later epoch should not pay again, kept in the cache beside the bytes it came from.

Once the files are on local disk, JPEG decoding is what holds training back (one core decodes and
augments a 500x375 flower in ~3.75 ms, so a 2-vCPU Colab runtime feeds a few hundred images per
second, whatever the storage). :class:`DecodedImages` is a source whose objects are another
source's images decoded once, at a reduced size (the whole picture, its shorter side ``size``, its
aspect kept; JPEGs decoded straight at a fraction of their size with PIL's draft mode), as raw
uint8 pixels: a random resized crop of them draws from the same picture as one of the JPEG. Read through a :class:`~dataferry.Cache`, each is decoded on its first read and kept
as an entry like any other: verified by CRC32C, under the budget, and keyed by the source object's
version and the decoding's identity, so a changed image or another ``size`` is decoded afresh.
Random crops and flips then run on the tensor (cheap), not on the JPEG.

With a GPU, the work can leave the CPU altogether (:mod:`dataferry.ondevice`, its names importable from here
too): workers hand over the JPEG's bytes and :class:`DecodeOnDevice` decodes and crops each batch on the GPU, or
they hand over decode-once's pixels and :class:`CropOnDevice` crops them there.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import struct
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from dataferry.cache import Cache
from dataferry.errors import BadArgument, DataferryError
from dataferry.ondevice import CropOnDevice, DecodeOnDevice, collate_encoded, collate_pixels, encoded, random_boxes
from dataferry.sources import Entry, Source, where

__all__ = ["BadImage", "image_errors", "DECODERS", "CropOnDevice", "DecodeOnDevice", "DecodedImages", "collate_encoded",
           "collate_pixels", "decode_image", "encoded", "pil_loader", "has_torchcodec_images", "pil_reduced", "pixels",
           "picture_bytes", "random_boxes", "record_bytes", "torchcodec_decode", "torchvision_decode"]

_VERSION = 2  # of the decoding below: a change to it must change every derived key


class BadImage(DataferryError, OSError):
    """An object that does not decode as an image (damaged, cut short, not an image, or too large to trust):
    the message names it and what to do. An ``OSError``, as PIL's own errors for such files are."""


@contextlib.contextmanager
def image_errors(where: Callable[[], str]) -> Iterator[None]:
    """A decoder's error for the image at ``where()`` (PIL's, torchvision's: they name a buffer, not the object) as
    one :class:`BadImage` line that names it; ``where`` is called only then (a sample's read pays nothing for it)."""
    from PIL import Image

    try:
        yield
    except BadImage:
        raise
    except Image.DecompressionBombError as e:
        raise BadImage(f"{where()} is too large to decode safely ({e}): if you trust it, raise "
                       "PIL.Image.MAX_IMAGE_PIXELS (in every DataLoader worker too), else leave it out with "
                       "is_valid_file") from None
    except (OSError, ValueError, SyntaxError, RuntimeError) as e:
        why = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "it", str(e)).strip() or type(e).__name__
        raise BadImage(f"{where()} does not decode as an image ({why}): it is damaged, cut short or not an image; "
                       "replace or remove it, or leave it out with is_valid_file") from None


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


def torchcodec_decode(data: bytes) -> Any:
    """An image's bytes as a ``3 x H x W`` uint8 RGB tensor, decoded by ``torchcodec.decoders.decode_image``
    (torchcodec 0.16+: the decoders that replace torchvision's, deprecated from torchvision 0.29; libjpeg-turbo for
    JPEGs, the same pixels as :func:`torchvision_decode`), straight from the bytes, without copying them."""
    from torchcodec.decoders import decode_image as tc_decode_image

    return tc_decode_image(data, mode="RGB")


def has_torchcodec_images() -> bool:
    """Whether torchcodec with image decoders (0.16 or later) is installed: its module file looked up, not imported
    (that loads torch and FFmpeg's libraries) and not its version read (55 ms of package metadata at import)."""
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("torchcodec")
    return bool(spec and spec.origin and (Path(spec.origin).parent / "decoders" / "_image_decoders.py").is_file())


#: The ways a DataLoader worker can decode an image, by name (each a picklable module-level function);
#: ``torchcodec`` where torchcodec 0.16+ is installed (it is not a dependency: it must match the torch installed).
DECODERS: dict[str, Callable[[bytes], Any]] = {"pil": pil_loader, "pil-reduced": pil_reduced,
                                               "torchvision": torchvision_decode}
if has_torchcodec_images():
    DECODERS["torchcodec"] = torchcodec_decode


#: A decoded image's record: a header (``DFP1``, height, width), its pixels (height x width x 3 uint8, row-major,
#: HWC), then zeros up to the record's fixed size (:func:`record_bytes`), which the cache's entry states before
#: the image is decoded.
_HEADER = struct.Struct("<4sHH")
_MAGIC = b"DFP1"


def record_bytes(size: int, max_side: int) -> int:
    """The bytes of a decoded image's record: room for ``size`` x ``max_side`` RGB pixels and the header."""
    return _HEADER.size + 3 * size * max_side


def picture_bytes(record: bytes) -> int:
    """How many of a record's first bytes hold its picture (its header and pixels; zeros pad the rest): all of them
    for bytes that are not a record."""
    if len(record) < _HEADER.size:
        return len(record)
    magic, h, w = _HEADER.unpack_from(record)
    return min(len(record), _HEADER.size + 3 * h * w) if magic == _MAGIC else len(record)


def decoded_shape(w: int, h: int, size: int, max_side: int) -> tuple[int, int]:
    """The (width, height) an image of ``w`` x ``h`` is decoded to: the shorter side ``size``, the aspect kept, unless
    the longer side would then pass ``max_side`` (an image over ``max_side / size`` times as long as it is wide):
    then the longer side is ``max_side`` and the shorter below ``size``. The whole picture, always."""
    scale = min(size / min(w, h), max_side / max(w, h))
    return max(1, min(max_side, round(w * scale))), max(1, min(max_side, round(h * scale)))


def decode_image(data: bytes, size: int, max_side: int | None = None, draft: bool = True) -> bytes:
    """An image's bytes -> its record (see :func:`record_bytes`): the whole picture, resized (antialiased) so its
    shorter side is ``size`` and its aspect kept (:func:`decoded_shape`; ``max_side`` defaults to ``2 * size``), never
    cropped, so a random resized crop of the pixels draws from the same picture as one of the JPEG. ``draft``: let a
    JPEG decode at 1/2, 1/4 or 1/8 of its size when that still covers the result (libjpeg's DCT scaling; far less
    work for large photos)."""
    from PIL import Image

    max_side = 2 * size if max_side is None else max_side
    with Image.open(io.BytesIO(data)) as img:
        w, h = img.size
        rw, rh = decoded_shape(w, h, size, max_side)
        if draft and img.format == "JPEG":
            img.draft("RGB", (rw, rh))
        rgb = img.convert("RGB")
    if rgb.size != (rw, rh):
        rgb = rgb.resize((rw, rh), Image.Resampling.BILINEAR, reducing_gap=None)
    out = bytearray(record_bytes(size, max_side))
    _HEADER.pack_into(out, 0, _MAGIC, rh, rw)
    out[_HEADER.size:_HEADER.size + 3 * rw * rh] = rgb.tobytes()
    return bytes(out)


def pixels(record: bytes) -> Any:
    """A record from :func:`decode_image` as a ``3 x H x W`` uint8 tensor (what torchvision's v2 transforms take):
    channels last in memory, torchvision's fast path for resizing uint8 images. Not a copy: a view of the record's
    memory (the copy took 5% of a sample's time in a worker). The tensor keeps the whole record alive (padding
    included, when the record has it: a dataset's later reads of it stop at its picture), and writing into it in
    place changes the record's bytes. A read from the cache returns bytes nothing
    else holds, so a dataset is safe; to keep pixels for long, or to change them in place when you will use the record
    again, use ``pixels(record).clone()``."""
    import torch

    magic, h, w = _HEADER.unpack_from(record)
    if magic != _MAGIC or len(record) < _HEADER.size + 3 * h * w:
        raise BadArgument(f"not a decoded image's record ({len(record)} bytes starting {bytes(record[:8])!r}): give "
                          "what decode_image or DecodedImages returned")
    _spend_torch_bytes_warning()
    flat = torch.frombuffer(record, dtype=torch.uint8, offset=_HEADER.size, count=3 * h * w)
    return flat.view(h, w, 3).permute(2, 0, 1)


_TORCH_WARNING = threading.Lock()


@functools.cache
def _spend_torch_bytes_warning() -> None:
    """torch warns once a process that a tensor over bytes can write to them (:func:`pixels` says what that means):
    that once is spent here, silenced. Under a lock, so two first calls never interleave their ``catch_warnings``
    (which would leave the filter behind); it races with another thread's filters this once only."""
    import torch

    with _TORCH_WARNING, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.frombuffer(b"\0", dtype=torch.uint8)


class DecodedImages:
    """The images of ``source`` decoded once (see :func:`decode_image`: the whole picture, shorter side ``size``,
    aspect kept, longer side at most ``max_side``, default ``2 * size``), read through ``cache``: a
    :class:`~dataferry.sources.Source` whose object ``name`` is the record of ``source``'s ``name``. Its entries
    come from :meth:`entry` (an entry of ``source`` -> the derived one); each version names the source object's
    version and this decoding, so neither is ever served stale. Every record has the same size (the pixels of the
    largest shape, then zeros), so the cache knows an entry's size before its image is decoded.

        decoded = DecodedImages(source, cache, size=256)
        data = cache.read_verified(decoded, decoded.entry(source.stat("roses/1.jpg")))   # decoded once
        image = pixels(data)                                                             # 3 x 256 x W uint8
    """

    def __init__(self, source: Source, cache: Cache, size: int = 256, *, max_side: int | None = None,
                 draft: bool = True) -> None:
        if type(size) is not int or not 16 <= size <= 4096:
            raise BadArgument(f"size={size!r}: give the decoded shorter side in pixels, 16 to 4096 (e.g. 256 for 224 "
                              "crops)")
        max_side = 2 * size if max_side is None else max_side
        if type(max_side) is not int or not size <= max_side <= 4 * size:
            raise BadArgument(f"max_side={max_side!r}: give the longest decoded side in pixels, from size ({size}) to "
                              f"four times it (default {2 * size}: photos up to 2:1 keep their full resolution)")
        self.source, self.cache, self.size, self.max_side, self.draft = source, cache, size, max_side, draft
        self.identity = f"rgb{size}max{max_side}{'-draft' if draft else ''}-v{_VERSION}"
        self.uri = f"{source.uri.rstrip('/')}/#decoded-{self.identity}"

    @property
    def sample_bytes(self) -> int:
        """The bytes of every record (:func:`record_bytes`)."""
        return record_bytes(self.size, self.max_side)

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
        original = self._original(entry)
        data = self.cache.read_verified(self.source, original)
        with image_errors(lambda: where(self.source, original.name)):
            data = decode_image(data, self.size, self.max_side, self.draft)
        out.write(data[start:] if start else data)
        return len(data) - start

    def __repr__(self) -> str:
        return (f"DecodedImages({self.source!r}, size={self.size}, max_side={self.max_side}"
                f"{'' if self.draft else ', draft=False'})")
