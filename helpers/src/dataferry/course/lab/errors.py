"""Errors the lab raises. Each message is one line that says what is wrong and what to do."""

from __future__ import annotations

from dataferry.errors import DataferryError

__all__ = ["LabError", "ToolError", "LabNotRunning", "BucketNotFound"]


class LabError(DataferryError, RuntimeError):
    """The lab could not do what was asked."""


class ToolError(LabError):
    """A lab tool is missing or failed to build."""


class LabNotRunning(LabError):
    """An operation needs a running lab and there is none."""


class BucketNotFound(LabError):
    """The named lab bucket does not exist."""
