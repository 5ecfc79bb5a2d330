"""Real JPEGs for the lab, in the public flowers set's layout: ``<class>/<name>.jpg`` in five class
folders, with its range of dimensions and file sizes, drawn from a seed.

The public set (``gs://cloud-samples-data/ai-platform/flowers/``, TensorFlow's flower photos) cannot
be reached offline, and random bytes cannot be decoded or learnt. These can: each class has its
own shape and palette (daisies are white petals round a yellow disc, dandelions a yellow burst of
thin rays, roses red or pink spirals, sunflowers long yellow petals round a large brown disc,
tulips cups on a stem), placed, sized, turned and coloured at random over a textured foliage
background, so a small CNN tells them apart in a few epochs while no two images are alike. The
same seed gives the same bytes (with the same Pillow and libjpeg).
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataferry.course.shipped import public_manifest

__all__ = ["CLASSES", "PUBLIC_COUNTS", "VERSION", "FlowerSet", "plan_flowers", "flower_jpeg"]

VERSION = 1  # of the drawing below: anything kept from an earlier version must be drawn again

CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")
#: Images per class in the public set (TensorFlow's flower_photos: 3,670 in all), from its manifest in data/public/.
PUBLIC_COUNTS: dict[str, int] = public_manifest("flowers")["images_per_class"]


def _rgb(rng: random.Random, base: tuple[int, int, int], spread: int = 25) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-spread, spread))) for c in base)  # type: ignore[return-value]


def _background(rng: random.Random, size: tuple[int, int]) -> Any:
    """Foliage: a few hundred soft blobs of greens and browns over a sky or soil tone, then grain."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    w, h = size
    img = Image.new("RGB", size, _rgb(rng, rng.choice([(70, 110, 60), (120, 150, 190), (95, 80, 55)]), 20))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(120, 260)):
        x, y, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(4, max(w, h) / 8)
        draw.ellipse((x - r, y - r * rng.uniform(0.3, 1), x + r, y + r), fill=_rgb(rng, rng.choice(
            [(50, 100, 40), (80, 130, 50), (30, 70, 30), (110, 90, 60), (140, 160, 90)]), 25))
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(1.5, 4)))
    grain = np.random.default_rng(rng.getrandbits(64)).normal(0, rng.uniform(6, 16), (h, w, 1))
    return Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) + grain, 0, 255).astype(np.uint8))


def _petals(draw: Any, cx: float, cy: float, n: int, inner: float, outer: float, width: float, turn: float,
            color: Any) -> None:
    for k in range(n):
        a = turn + 2 * math.pi * k / n
        c, s = math.cos(a), math.sin(a)
        mx, my = cx + c * (inner + outer) / 2, cy + s * (inner + outer) / 2
        half = (outer - inner) / 2
        pts = [(mx + c * half, my + s * half), (mx - s * width, my + c * width),
               (mx - c * half, my - s * half), (mx + s * width, my - c * width)]
        draw.polygon(pts, fill=color)


def _flower(kind: str, draw: Any, rng: random.Random, cx: float, cy: float, r: float) -> None:
    """One bloom of ``kind`` centred at (cx, cy), radius ``r``."""
    turn = rng.uniform(0, 2 * math.pi)
    if kind == "daisy":
        _petals(draw, cx, cy, rng.randint(14, 24), r * 0.2, r, r * 0.09, turn, _rgb(rng, (245, 245, 240), 10))
        c = r * rng.uniform(0.18, 0.26)
        draw.ellipse((cx - c, cy - c, cx + c, cy + c), fill=_rgb(rng, (235, 190, 30), 20))
    elif kind == "dandelion":
        color = _rgb(rng, (250, 205, 20), 15)
        for k in range(rng.randint(60, 110)):
            a, length = turn + rng.uniform(0, 2 * math.pi), r * rng.uniform(0.55, 1.0)
            draw.line((cx, cy, cx + math.cos(a) * length, cy + math.sin(a) * length), fill=color, width=max(1, int(r / 30)))
        c = r * 0.35
        draw.ellipse((cx - c, cy - c, cx + c, cy + c), fill=_rgb(rng, (240, 180, 10), 15))
    elif kind == "roses":
        base = rng.choice([(200, 20, 40), (230, 90, 130), (170, 10, 30)])
        for k in range(7, 0, -1):
            rr = r * k / 7
            shade = tuple(int(v * (0.6 + 0.4 * (k % 2))) for v in base)
            draw.pieslice((cx - rr, cy - rr, cx + rr, cy + rr), math.degrees(turn) + 50 * k,
                          math.degrees(turn) + 50 * k + 300, fill=_rgb(rng, shade, 10))  # type: ignore[arg-type]
    elif kind == "sunflowers":
        _petals(draw, cx, cy, rng.randint(18, 28), r * 0.38, r, r * 0.11, turn, _rgb(rng, (250, 200, 0), 15))
        c = r * rng.uniform(0.38, 0.48)
        draw.ellipse((cx - c, cy - c, cx + c, cy + c), fill=_rgb(rng, (80, 45, 15), 15))
    else:  # tulips: a cup of three petals on a stem
        color = _rgb(rng, rng.choice([(220, 30, 60), (240, 120, 160), (150, 50, 160), (250, 170, 30)]), 15)
        draw.line((cx, cy, cx + rng.uniform(-r / 3, r / 3), cy + 2.2 * r), fill=(40, 110, 40), width=max(2, int(r / 9)))
        draw.ellipse((cx - r * 0.55, cy - r * 0.6, cx + r * 0.55, cy + r * 0.5), fill=color)
        for dx in (-0.45, 0.0, 0.45):
            draw.polygon([(cx + (dx - 0.22) * r, cy - 0.2 * r), (cx + dx * r, cy - r), (cx + (dx + 0.22) * r, cy - 0.2 * r)],
                         fill=color)


def flower_jpeg(kind: str, seed: int) -> bytes:
    """One JPEG of ``kind`` (one of :data:`CLASSES`), drawn from ``seed``: 240-500 px on its long side,
    landscape mostly, one to four blooms, quality 75-95: tens of KB, as in the public set."""
    from PIL import Image, ImageDraw, ImageFilter

    if kind not in CLASSES:
        raise ValueError(f"no flower class {kind!r}: choose one of {', '.join(CLASSES)}")
    rng = random.Random(f"{kind}:{seed}")
    long_side = rng.choice([500, 500, 500, rng.randint(240, 500)])
    short = int(long_side * rng.uniform(0.62, 0.8))
    size = (long_side, short) if rng.random() < 0.8 else (short, long_side)
    img = _background(rng, size)
    draw = ImageDraw.Draw(img)
    blooms = rng.choice([1, 1, 1, 2, 3, 4])
    for _ in range(blooms):
        r = min(size) * rng.uniform(0.18, 0.42) / math.sqrt(blooms)
        _flower(kind, draw, rng, rng.uniform(r, size[0] - r), rng.uniform(r, size[1] - r), r)
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=rng.randint(75, 95))
    return out.getvalue()


@dataclass
class FlowerSet:
    """A planned set of flower JPEGs: object names ``<prefix><class>/<id>.jpg`` -> (class, seed). Bytes are
    drawn on demand (:meth:`content`), once each, and kept in memory."""

    prefix: str
    plan: dict[str, tuple[str, int]]
    _bytes: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def object_names(self) -> list[str]:
        return list(self.plan)

    @property
    def classes(self) -> list[str]:
        return sorted({kind for kind, _ in self.plan.values()})

    def label(self, name: str) -> str:
        return self.plan[name][0]

    def content(self, name: str) -> bytes:
        if name not in self._bytes:
            self._bytes[name] = flower_jpeg(*self.plan[name])
        return self._bytes[name]

    def objects(self, workers: int = 4) -> Iterator[tuple[str, bytes]]:
        """(name, JPEG bytes) of every object, drawn by ``workers`` threads (Pillow draws without the GIL)."""
        with ThreadPoolExecutor(workers) as pool:
            yield from zip(self.plan, pool.map(self.content, self.plan))

    def upload(self, bucket: Any, workers: int = 8) -> FlowerSet:
        """Put every image into a google-cloud-storage ``bucket`` (a lab bucket)."""
        def put(item: tuple[str, bytes]) -> None:
            bucket.blob(item[0]).upload_from_string(item[1], content_type="image/jpeg")

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(put, self.objects()))
        return self

    def write_to(self, folder: str | Path) -> FlowerSet:
        """Write every image under ``folder`` (a Drive or local folder stand-in)."""
        for name, data in self.objects():
            path = Path(folder) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return self

    def __repr__(self) -> str:
        return f"<FlowerSet {len(self.plan)} JPEGs in {len(self.classes)} classes under {self.prefix!r}>"


def plan_flowers(per_class: int | dict[str, int] = 100, *, seed: int = 0, prefix: str = "flowers/") -> FlowerSet:
    """A set of ``per_class`` images of each class (or a count per class, e.g. :data:`PUBLIC_COUNTS`), named
    as the public set names them (``<class>/<digits>_<hex>.jpg``), from ``seed``."""
    counts = per_class if isinstance(per_class, dict) else dict.fromkeys(CLASSES, per_class)
    rng = random.Random(f"flowers:{seed}")
    plan: dict[str, tuple[str, int]] = {}
    for kind, n in counts.items():
        if kind not in CLASSES:
            raise ValueError(f"no flower class {kind!r}: choose from {', '.join(CLASSES)}")
        for _ in range(n):
            name = f"{prefix}{kind}/{rng.randrange(10**7, 10**11)}_{rng.randbytes(5).hex()}.jpg"
            plan[name] = (kind, rng.getrandbits(48))
    return FlowerSet(prefix, plan)
