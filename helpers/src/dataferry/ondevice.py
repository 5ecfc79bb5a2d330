"""Augmenting on the GPU: the DataLoader's workers only read, and each batch is cropped, resized and flipped on the
device, in one place for the whole batch.

On a GPU runtime with few CPUs (Colab's have 2), what the workers do per image decides the feed. Two ways to take
work off them, each a collate function for the DataLoader and a wrapper around it:

- the JPEGs themselves (:func:`encoded`, :func:`collate_encoded`, :class:`DecodeOnDevice`): each batch decoded on
  the GPU in one call (nvJPEG), then cropped;
- decode-once's pixels (``CachedImageFolder(..., decode_once=256)`` without a ``transform``, :func:`collate_pixels`,
  :class:`CropOnDevice`): the images were decoded once into the cache; the workers read and check each record, and
  the random resized crop, most of what is left of a sample's time in a worker (``make bench-train`` prints the
  stages), runs on the GPU.

Both crop each image as ``RandomResizedCrop(size, scale, ratio)`` draws its box (:func:`random_boxes`) and flip it at
random, giving ``N x 3 x size x size`` uint8 batches on the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dataferry.errors import BadArgument

__all__ = ["CropOnDevice", "DecodeOnDevice", "collate_encoded", "collate_pixels", "encoded", "random_boxes"]


def encoded(data: bytes) -> Any:
    """A JPEG's bytes, undecoded, as a 1-D uint8 tensor: the ``loader`` for :class:`DecodeOnDevice`. Refuses
    anything else (nvJPEG decodes JPEGs only) with :class:`~dataferry.BadArgument`."""
    import torch

    if data[:2] != b"\xff\xd8":
        raise BadArgument(f"an image that is not a JPEG (it starts {data[:4]!r}): DecodeOnDevice decodes JPEGs only; "
                          "use a CPU decoder from DECODERS for other formats")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def collate_encoded(batch: list[tuple[Any, Any]]) -> tuple[Any, Any, Any]:
    """A DataLoader's ``collate_fn`` for :func:`encoded` images: ``(bytes, lengths, targets)``, the images'
    bytes end to end in one uint8 tensor, so a batch crosses from a worker in one piece of shared memory
    and is pinned in one allocation (a list of 256 tensors took 256 of each)."""
    import torch

    images, targets = zip(*batch)
    return torch.cat(images), torch.tensor([len(i) for i in images]), torch.as_tensor(targets)


def _kind(value: Any) -> str:
    """What a value is, in a few words on one line, for a message: a tensor's dtype and shape, a scalar's value, a
    container's length, else its type's name and package."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of {tuple(value.shape)}"
    kind = type(value)
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, str, bytes)):
        shown = repr(value)
        return f"the {kind.__qualname__} {shown[:40]}{'...' if len(shown) > 40 else ''}"
    named = f"{'an' if kind.__qualname__[:1].lower() in 'aeiou' else 'a'} {kind.__qualname__}"
    if kind.__module__ == "builtins":
        return f"{named} of {len(value)}" if hasattr(value, "__len__") else named
    return f"{named} ({kind.__module__.partition('.')[0]})"


def collate_pixels(batch: list[tuple[Any, Any]]) -> tuple[Any, Any, Any]:
    """A DataLoader's ``collate_fn`` for decode-once samples as they are read (``3 x H x W`` uint8, each image its
    own size): ``(pixels, shapes, targets)``, every image's pixels (``H x W x 3``, as the record stores them) end to
    end in one uint8 tensor, ``shapes`` ``N x 2`` (height, width). In a worker the tensor is made in shared memory,
    as ``default_collate`` makes its batches: the batch crosses to the main process in one piece, copied once."""
    import torch
    from torch.utils.data import get_worker_info

    images, targets = zip(*batch)
    for image in images:
        if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 3
                and image.shape[0] == 3):
            raise BadArgument(f"collate_pixels takes decode-once samples as they are read (3 x H x W uint8), not "
                              f"{_kind(image)}: give the dataset decode_once and no transform (CropOnDevice crops "
                              "on the device)")
    flat = [image.permute(1, 2, 0).reshape(-1) for image in images]  # no copy: pixels() keeps them channels-last
    out = None
    if get_worker_info() is not None:
        numel = sum(f.numel() for f in flat)
        out = flat[0].new(flat[0]._typed_storage()._new_shared(numel, device="cpu")).resize_(numel)
    return (torch.cat(flat, out=out), torch.tensor([tuple(image.shape[1:]) for image in images]),
            torch.as_tensor(targets))


def _check_crop(scale: tuple[float, float], ratio: tuple[float, float], tries: int = 1) -> None:
    if not (0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1] and tries >= 1):
        raise BadArgument(f"scale={scale!r}, ratio={ratio!r}, tries={tries!r}: give 0 < scale low <= high <= 1, "
                          "0 < ratio low <= high and tries >= 1")


def random_boxes(sizes: Any, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), tries: int = 10) -> Any:
    """``RandomResizedCrop``'s boxes for a whole batch at once: ``sizes`` is an ``N x 2`` tensor of (width,
    height); returns ``N x 4`` (x0, y0, x1, y1) in pixels. Each image's box covers ``scale`` of its area
    with an aspect ratio in ``ratio`` (log-uniform), the first of ``tries`` draws that fits, else the
    largest centred box within ``ratio``: torchvision's rule, drawn for every image in one go."""
    import math

    import torch

    _check_crop(scale, ratio, tries)
    w, h = sizes[:, :1].double(), sizes[:, 1:].double()
    n = len(sizes)
    area = w * h * torch.empty(n, tries, dtype=torch.float64).uniform_(*scale)
    r = torch.exp(torch.empty(n, tries, dtype=torch.float64).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    cw, ch = torch.sqrt(area * r).round(), torch.sqrt(area / r).round()
    fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = fits.double().argmax(1, keepdim=True)
    found = fits.any(1, keepdim=True)
    aspect = w / h  # no draw fitted: the whole image, cut to the nearest ratio allowed
    fw = torch.where(aspect > ratio[1], (h * ratio[1]).round(), w)
    fh = torch.where(aspect < ratio[0], (w / ratio[0]).round(), h)
    cw = torch.where(found, cw.gather(1, first), fw)
    ch = torch.where(found, ch.gather(1, first), fh)
    x0 = torch.where(found, (torch.rand(n, 1, dtype=torch.float64) * (w - cw + 1)).floor(), ((w - cw) / 2).floor())
    y0 = torch.where(found, (torch.rand(n, 1, dtype=torch.float64) * (h - ch + 1)).floor(), ((h - ch) / 2).floor())
    return torch.cat([x0, y0, x0 + cw, y0 + ch], 1)


#: The most values (images x 3 x H x W) one canvas of :func:`_pieces` holds, unless one image alone is larger: with
#: its index, about 220 MB on the device while it is made.
CANVAS_ELEMENTS = 1 << 24


def _pieces(shapes: list[tuple[int, int]]) -> list[list[int]]:
    """A batch's images (``(H, W)`` each) as pieces of a canvas each: portrait apart from landscape, similar sizes
    together, each piece's ``k x 3 x tallest x widest`` within :data:`CANVAS_ELEMENTS` (an image larger alone)."""
    order = sorted(range(len(shapes)), key=lambda i: (shapes[i][0] > shapes[i][1], *shapes[i]))
    pieces: list[list[int]] = []
    tall = wide = 0
    for i in order:
        h, w = shapes[i]
        if (pieces and (h > w) == (tall > wide)
                and (len(pieces[-1]) + 1) * 3 * max(tall, h) * max(wide, w) <= CANVAS_ELEMENTS):
            pieces[-1].append(i)
            tall, wide = max(tall, h), max(wide, w)
        else:
            pieces.append([i])
            tall, wide = h, w
    return pieces


def _canvas(flat: Any, table: Any, tall: int, wide: int) -> Any:
    """One piece's ``k x 3 x H x W`` float32 canvas, gathered from ``flat`` (the images' values) by ``table``
    (``k x 6`` on the device: height, width, offset and the channel, row and column strides in ``flat``), ``tall``
    x ``wide`` the piece's largest height and width; each
    image's last row and column repeated past its own edge. roi_align clamps a sample past an image's edge to that
    edge, so a box within an image gives the pixels it gives the image alone, and one call crops the piece."""
    import torch

    heights, widths, offsets, channel, row, column = table.unbind(1)
    ys, xs, cs = (torch.arange(n, device=flat.device) for n in (tall, wide, 3))
    y = torch.minimum(ys[None, :], heights[:, None] - 1)  # past an image's bottom: its last row
    x = torch.minimum(xs[None, :], widths[:, None] - 1)  # past its right edge: its last column
    index = (offsets[:, None, None, None] + cs[None, :, None, None] * channel[:, None, None, None]
             + (y * row[:, None])[:, None, :, None] + (x * column[:, None])[:, None, None, :])
    return flat[index].float()


class CropOnDevice:
    """Batches of decode-once pixels from ``loader`` (a DataLoader over ``CachedImageFolder(..., decode_once=...)``
    without a ``transform``, with ``collate_fn=collate_pixels``; or over any dataset of ``3 x H x W`` uint8 images
    without one), moved to ``device`` and there cropped and resized as ``RandomResizedCrop(size, scale, ratio)``
    does (``torchvision.ops.roi_align`` over the batch's images, a few calls for the whole batch: it averages the
    pixels each output pixel covers, each image's own edge repeated past it; along a box edge inside the image it
    interpolates with the pixels beyond, where torchvision repeats the edge), and flipped at random (``flip``):
    ``(N x 3 x size x size uint8, targets)``, both on ``device``. The CPU workers only read and check each record.
    Iterate it once per epoch, as the DataLoader::

        ds = CachedImageFolder(source, cache, decode_once=256)  # no transform: the GPU crops
        batches = CropOnDevice(DataLoader(ds, batch_size=256, num_workers=2, collate_fn=collate_pixels,
                                          pin_memory=True))
        for x, y in batches: ...
    """

    #: What the batches must be, and the collate function that makes them (said when a batch is not one).
    takes = "(pixels, shapes, targets): give its DataLoader collate_fn=collate_pixels, over a decode-once dataset"
    #: The dimensions of a batch's second tensor (``shapes``: N x 2), which tells the two kinds of batch apart.
    sizes_ndim = 2

    def __init__(self, loader: Any, size: int = 224, device: str = "cuda", *, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True) -> None:
        if type(size) is not int or not 16 <= size <= 4096:
            raise BadArgument(f"size={size!r}: give the crop's side in pixels, 16 to 4096 (e.g. 224)")
        _check_crop(scale, ratio)
        import torch
        from torch.utils.data import Subset

        dataset = getattr(loader, "dataset", None)
        while isinstance(dataset, Subset):
            dataset = dataset.dataset
        self._check(dataset)
        self.loader, self.size, self.device = loader, size, torch.device(device)
        self.scale, self.ratio, self.flip = scale, ratio, flip

    def _check(self, dataset: Any) -> None:
        """Refuse a DataLoader's dataset with a transform: the workers would run it before the device augments."""
        if getattr(dataset, "transform", None) is not None:
            raise BadArgument(f"{type(self).__name__} augments each batch on the device, after the workers: give the "
                              f"dataset no transform (it has {_kind(dataset.transform)}, which the workers would run "
                              "first)")

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for batch in self.loader:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 3
                    and getattr(batch[1], "ndim", None) == self.sizes_ndim):
                given = ", ".join(_kind(b) for b in batch) if isinstance(batch, (tuple, list)) else _kind(batch)
                raise BadArgument(f"{type(self).__name__} takes batches of {self.takes}; not ({given})")
            yield self.crop(self.images(batch[0], batch[1])), batch[2].to(self.device, non_blocking=True)

    def images(self, data: Any, shapes: Any) -> list[Any]:
        """One batch's images on the device, each ``3 x H x W`` uint8: here each image's pixels, moved there in one
        copy and viewed in place (channels-last, as stored)."""
        data = data.to(self.device, non_blocking=True)
        shapes = shapes.tolist()
        return [flat.view(h, w, 3).permute(2, 0, 1) for flat, (h, w) in zip(data.split([3 * h * w for h, w in shapes]),
                                                                            shapes)]

    def crop(self, images: list[Any], boxes: Any = None) -> Any:
        """Decoded ``3 x H x W`` uint8 images (on the device) -> one ``N x 3 x size x size`` uint8 batch: each
        image's box (``boxes``, ``N x 4`` (x0, y0, x1, y1) in pixels within the image; default
        :func:`random_boxes`) resized to ``size`` x ``size``, then flipped at random if ``flip``. A few calls for
        the whole batch (:func:`_pieces`), not one per image: on a GPU every call is the main process's time."""
        import torch
        from torchvision import ops

        if boxes is None:
            sizes = torch.tensor([[img.shape[-1], img.shape[-2]] for img in images])
            boxes = random_boxes(sizes, self.scale, self.ratio)
        odd = [tuple(img.shape) for img in images if img.dim() != 3 or img.shape[0] != 3]
        if odd:
            raise BadArgument(f"{type(self).__name__} crops 3 x H x W images; given {odd[0]}: decode to RGB")
        shapes = [(int(img.shape[1]), int(img.shape[2])) for img in images]
        pieces = _pieces(shapes)
        order = [i for piece in pieces for i in piece]
        shared = len({(img.untyped_storage().data_ptr(), img.dtype) for img in images}) == 1
        rows = []  # each image's table row, in piece order
        for piece in pieces:
            start = 0
            for i in piece:  # one buffer (collate_pixels' batch): as it lies; else a piece's images end to end
                img = images[i]
                rows.append([*shapes[i], *((img.storage_offset(), *img.stride()) if shared else
                                           (start, shapes[i][0] * shapes[i][1], shapes[i][1], 1))])
                start += img.numel()
        rois = torch.cat([torch.zeros(len(images), 1, dtype=torch.float64), boxes.double()], 1)[order].float()
        table = torch.tensor(rows, dtype=torch.int64)
        where = torch.tensor(order, dtype=torch.int64)
        if self.device.type == "cuda":  # small tables, one pinned copy each: nothing waits for the GPU
            rois, table, where = rois.pin_memory(), table.pin_memory(), where.pin_memory()
        rois, table, where = (t.to(self.device, non_blocking=True) for t in (rois, table, where))
        flat = (torch.empty(0, dtype=images[0].dtype, device=self.device).set_(images[0].untyped_storage())
                if shared else None)
        out = torch.empty(len(images), 3, self.size, self.size, dtype=torch.float32, device=self.device)
        done = 0
        for piece in pieces:
            k = len(piece)
            values = flat if shared else torch.cat([images[i].reshape(-1) for i in piece])
            tall, wide = max(shapes[i][0] for i in piece), max(shapes[i][1] for i in piece)
            canvas = _canvas(values, table[done:done + k], tall, wide)
            part = rois[done:done + k].clone()
            part[:, 0] = torch.arange(k, device=self.device)  # each box's image within this canvas
            out[where[done:done + k]] = ops.roi_align(canvas, part, self.size, sampling_ratio=-1, aligned=True)
            del canvas
            done += k
        if self.flip:
            mirror = torch.rand(len(images), device=self.device) < 0.5
            out = torch.where(mirror[:, None, None, None], out.flip(-1), out)
        return out.round_().clamp_(0, 255).to(torch.uint8)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.size}px on {self.device}>"


class DecodeOnDevice(CropOnDevice):
    """Batches of encoded JPEGs from ``loader`` (a DataLoader over a dataset whose ``loader`` is :func:`encoded`,
    without a ``transform``, with ``collate_fn=collate_encoded``), decoded on ``device`` in one call per batch
    (``torchvision.io.decode_jpeg``: nvJPEG on a CUDA device), then cropped, resized and flipped as
    :class:`CropOnDevice` does: ``(N x 3 x size x size uint8, targets)``, both on ``device``. The CPU workers only
    read bytes. Iterate it once per epoch, as the DataLoader::

        ds = CachedImageFolder(source, cache, loader=encoded)
        batches = DecodeOnDevice(DataLoader(ds, batch_size=256, num_workers=2, collate_fn=collate_encoded))
        for x, y in batches: ...
    """

    takes = ("(bytes, lengths, targets): give its DataLoader collate_fn=collate_encoded, over a dataset whose loader "
             "is encoded")
    sizes_ndim = 1  # lengths: N

    def _check(self, dataset: Any) -> None:
        """Refuse a dataset of decode-once's pixels, or one with a transform."""
        if getattr(dataset, "decoded", None) is not None:
            raise BadArgument("DecodeOnDevice decodes JPEGs, and this dataset reads decode-once's pixels: give it "
                              "loader=encoded and no decode_once (or crop those pixels on the device: CropOnDevice)")
        super()._check(dataset)

    def images(self, data: Any, lengths: Any) -> list[Any]:
        """One batch's JPEGs decoded on the device in one call."""
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(list(data.split(lengths.tolist())), mode=ImageReadMode.RGB, device=self.device)
