"""torchvision's ``v2.RandomResizedCrop``, the same pixels in less time on uint8 image tensors.

After the cache and decode-once, the random resized crop is most of a sample's time in a DataLoader worker
(``make bench-train`` prints the stages). torchvision crops with a view, then resizes it; a view of a
channels-last image (what :func:`dataferry.decode.pixels` gives) is not contiguous, and resizing it took
torch's slower path (an upsampled crop cost 230-280 us instead of 125-180 here). :class:`RandomResizedCrop`
copies the crop channels-last first, then resizes it with torchvision's own kernel: the boxes are drawn by
torchvision's code from the same random numbers, and the output is bitwise the same (tested).
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ["RandomResizedCrop"]


class RandomResizedCrop(v2.RandomResizedCrop):
    """``torchvision.transforms.v2.RandomResizedCrop`` (same arguments, same boxes, same output), faster on a
    ``C x H x W`` uint8 tensor: the crop is copied channels-last before it is resized. Anything else (PIL images,
    other dtypes, batches, boxes and masks beside the image) is left to torchvision's code. A drop-in::

        tf = v2.Compose([RandomResizedCrop(224), v2.RandomHorizontalFlip()])
    """

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not (type(inpt) in (torch.Tensor, tv_tensors.Image) and inpt.dtype == torch.uint8 and inpt.ndim == 3):
            theirs = getattr(super(), "transform", None) or getattr(super(), "_transform")
            return theirs(inpt, params)
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        crop = inpt.as_subclass(torch.Tensor)[:, top:top + height, left:left + width]
        crop = crop.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        out = F.resize(crop, list(self.size), interpolation=self.interpolation, antialias=self.antialias)
        return tv_tensors.wrap(out, like=inpt) if isinstance(inpt, tv_tensors.Image) else out

    _transform = transform  # torchvision before 0.21 calls it by this name
