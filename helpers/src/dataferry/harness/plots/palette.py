"""One colour per method in every figure, and the shades that mark first reads and repeats."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import seaborn as sns
from matplotlib.patches import Patch

#: Known methods, roughly fastest and most local first; figures order their x axes this way.
METHOD_ORDER: list[str] = [
    "local", "dataferry", "gcsfuse-cache", "gcsfuse", "api-parallel", "api-serial", "drive", "folder",
]

_KNOWN_COLOURS = sns.color_palette("colorblind", 10)
# Colours for methods not in METHOD_ORDER, picked to stay apart from the eight above: the colorblind
# yellow, then near-black, teal, olive, dark violet, crimson, lime and the colorblind light blue.
_EXTRA_COLOURS = [
    _KNOWN_COLOURS[8], (0.15, 0.15, 0.15), (0.0, 0.55, 0.55), (0.55, 0.55, 0.0),
    (0.35, 0.2, 0.55), (0.6, 0.0, 0.2), (0.5, 0.8, 0.3), _KNOWN_COLOURS[9],
]

RGB = tuple[float, float, float]


def method_palette(methods: Iterable[str]) -> dict[str, RGB]:
    """One RGB colour per method, the same in every figure whatever other methods are present.

    Known methods take the colorblind-palette colour at their index in :data:`METHOD_ORDER`. Other
    methods take a colour slot chosen by a stable hash of their name, so a method's colour does not
    depend on its neighbours; two unknown methods that hash to the same slot are separated by
    taking the next free slot in name order (only then can a colour depend on which are present).
    """
    names = sorted({str(m) for m in methods})
    palette: dict[str, RGB] = {}
    unknown = []
    for name in names:
        if name in METHOD_ORDER:
            palette[name] = rgb(_KNOWN_COLOURS[METHOD_ORDER.index(name)])
        else:
            unknown.append(name)
    taken: set[int] = set()
    overflow = []
    for name in unknown:
        start = zlib.crc32(name.encode()) % len(_EXTRA_COLOURS)
        for step in range(len(_EXTRA_COLOURS)):
            slot = (start + step) % len(_EXTRA_COLOURS)
            if slot not in taken:
                taken.add(slot)
                palette[name] = rgb(_EXTRA_COLOURS[slot])
                break
        else:
            overflow.append(name)
    if overflow:
        for name, colour in zip(overflow, sns.color_palette("husl", len(overflow))):
            palette[name] = rgb(colour)
    return palette


def ordered_methods(methods: Iterable[str]) -> list[str]:
    """The methods present, known ones in :data:`METHOD_ORDER`, others after them by name."""
    present = set(methods)
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def rgb(colour: Sequence[float]) -> RGB:
    return (float(colour[0]), float(colour[1]), float(colour[2]))


def lighter(colour: RGB, share: float = 0.55) -> RGB:
    return rgb([c + (1.0 - c) * share for c in colour])


def darker(colour: RGB, share: float = 0.45) -> RGB:
    return rgb([c * (1.0 - share) for c in colour])


def patch(colour: RGB, hatched: bool, label: str) -> Patch:
    """A legend entry: solid for first reads, lighter and hatched for repeats."""
    face = lighter(colour) if hatched else colour
    return Patch(facecolor=face, edgecolor=darker(colour), hatch="///" if hatched else None, label=label)
