"""dataferry.crops.RandomResizedCrop: torchvision's transform, the same boxes and bitwise the same pixels."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from PIL import Image  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from dataferry.crops import RandomResizedCrop  # noqa: E402


def _inputs():
    g = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (256, 341, 3), dtype=torch.uint8, generator=g)
    chw = torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=g)
    return {
        "channels-last view (decode-once's pixels)": hwc.permute(2, 0, 1),
        "contiguous CHW": chw,
        "tv_tensors.Image": tv_tensors.Image(chw),
        "smaller than the crop": torch.randint(0, 256, (3, 100, 150), dtype=torch.uint8, generator=g),
        "PIL image": Image.fromarray(hwc.numpy()),
        "a batch": torch.randint(0, 256, (2, 3, 64, 80), dtype=torch.uint8, generator=g),
        "float": torch.rand(3, 64, 80, generator=g),
    }


@pytest.mark.parametrize("name", list(_inputs()))
@pytest.mark.parametrize("args", [dict(size=224), dict(size=(96, 128), scale=(0.5, 1.0), ratio=(0.5, 2.0))])
def test_the_same_crops_and_pixels_as_torchvisions(name, args):
    image = _inputs()[name]
    for seed in range(20):
        torch.manual_seed(seed)
        theirs = v2.RandomResizedCrop(**args, antialias=True)(image)
        torch.manual_seed(seed)
        ours = RandomResizedCrop(**args, antialias=True)(image)
        assert type(ours) is type(theirs)
        if isinstance(theirs, Image.Image):
            assert ours.tobytes() == theirs.tobytes()
        else:
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (name, seed)


def test_it_composes_with_v2_transforms_and_crops_to_its_size():
    tf = v2.Compose([v2.ToImage(), RandomResizedCrop(48), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    x = tf(torch.randint(0, 256, (3, 90, 120), dtype=torch.uint8))
    assert x.shape == (3, 48, 48) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
