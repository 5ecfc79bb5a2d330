"""What a lesson concludes from its run, in a few short sentences computed by tested code.

A lesson never writes a verdict itself: it calls one function of a topic module here with what it
measured, and prints the :class:`Conclusion` it returns. Every sentence's threshold is a named constant
of its module, and the tests check the wording on both sides of each.

    >>> from dataferry.findings import cache
    >>> print(cache.budget_and_verify(...))
    In this run (lab:colocated; 200 images, 9.1 MB):
    - A budget of 4.56 MB (50% of the images' bytes) held: usage peaked at 4.55 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Conclusion", "mb"]


def mb(n: float) -> str:
    """Bytes as megabytes, to two decimals below 10 MB and one above."""
    return f"{n / 1e6:.2f} MB" if n < 10e6 else f"{n / 1e6:.1f} MB"


@dataclass
class Conclusion:
    """Sentences about one run, headed by where it ran (``lab:<profile>`` figures are never cloud figures)."""

    where: str
    sentences: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([f"In this run ({self.where}):", *(f"- {s}" for s in self.sentences)])

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.sentences)
