"""What a lesson concludes from its run, in a few short sentences computed by tested code.

A lesson never writes a verdict itself: it calls one function of a topic module here with what it
measured, and prints the :class:`Conclusion` it returns. Every sentence's threshold is a named constant
of its module, and the tests check the wording on both sides of each.

    >>> from dataferry.course.findings import cache
    >>> print(cache.budget_and_verify(...))
    In this run (lab:colocated; 200 images, 9.1 MB):
    - A budget of 4.56 MB (50% of the images' bytes) held: usage peaked at 4.55 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MIN_REPEATS", "Conclusion", "interval", "judged", "listed", "mb", "percent", "where_said"]

#: Fewer repetitions than this give no interval worth judging.
MIN_REPEATS = 3


def mb(n: float) -> str:
    """Bytes as megabytes, to two decimals below 10 MB and one above."""
    return f"{n / 1e6:.2f} MB" if n < 10e6 else f"{n / 1e6:.1f} MB"


def percent(value: float, at: float) -> str:
    """``value`` in whole percent, or to a tenth where whole percent would put it on the other side of ``at`` than
    it is: an AU of 89.92% beside a verdict that it was below 90% reads 89.9%, not 90%."""
    if (value < at) == (round(value * 100) < at * 100):
        return f"{value:.0%}"
    tenths = math.floor(value * 1000) if value < at else math.ceil(value * 1000)
    return f"{tenths / 10:.1f}%"


def listed(items: list[str], last: str) -> str:
    """``a, b and c`` (``last`` the final joining word)."""
    return f"{', '.join(items[:-1])} {last} {items[-1]}" if len(items) > 1 else "".join(items)


def where_said(region: str) -> str:
    """A run's heading: ``lab:<profile>`` as it is, a cloud region named as one, an unknown one said so."""
    if region.startswith("lab:"):
        return region
    return f"region {region}" if region and region != "unknown" else "region unknown, not found"


def interval(a: Any, b: Any, seed: int = 0) -> tuple[float, float, float]:
    """The ratio of ``a``'s median to ``b``'s, with its 95% bootstrap interval (:func:`dataferry.harness.stats.speedup`)."""
    from dataferry.harness.stats import speedup

    return speedup(a.to_numpy(float), b.to_numpy(float), seed=seed)


def judged(r: float, lo: float, hi: float, at: float, above: str, below: str, of: str = "", n: int = 5) -> str:
    """A ratio and its interval said against the threshold ``at``: ``above`` when the whole interval is above
    it, ``below`` when it is all below, and that this run cannot tell when it straddles it or rests on fewer
    than :data:`MIN_REPEATS` repetitions (``n``)."""
    if n < MIN_REPEATS:
        return f"{r:.2f}x{of} (from {n} repetition(s): no interval, so this run cannot tell)."
    ci = f"{r:.2f}x{of} [95% CI {lo:.2f}, {hi:.2f}]"
    if lo > at:
        return f"{ci}: {above}"
    if hi < at:
        return f"{ci}: {below}"
    return f"{ci}: the interval straddles {at:g}x, so this run cannot tell (raise REPEATS)."


@dataclass
class Conclusion:
    """Sentences about one run, headed by where it ran (``lab:<profile>`` figures are never cloud figures)."""

    where: str
    sentences: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([f"In this run ({self.where}):", *(f"- {s}" for s in self.sentences)])

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.sentences)
