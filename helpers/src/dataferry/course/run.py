"""What a lesson's helpers use of a run of the course: a Protocol that :class:`dataferry.course.Course` meets.

The helpers (``lessondata``, ``lessonfiles``, ...) are reached through ``Course``'s methods and are handed the
run; typing them against this Protocol rather than the class keeps the front door's import one way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dataferry.harness.runtime import Region


class Course(Protocol):
    """One lesson's run, as its helpers see it."""

    lesson: str
    where: str
    results_dir: Path

    def cloud_data(self, bucket: str = "", prefix: str = "", project: str = "", dataset: str = "flowers") -> Any: ...

    def folder(self, given: str, name: str) -> Path: ...

    def images(self, n: int, *, seed: int = 0, bucket: str = "", prefix: str = "", profile: str = "colocated",
               held_out: int = 0) -> Any: ...

    def on_finish(self, undo: Any) -> None: ...

    def region(self, override: str = "", lab_profile: str | None = None) -> Region: ...

    def finish(self) -> Path | None: ...
