"""Progress bars for a person watching: tqdm's, switched off by ``progress=False`` or by tqdm's own
``TQDM_DISABLE=1`` (``make course`` sets it: in an executed notebook every redraw of a bar would stay
behind as an output chunk)."""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    # Without ipywidgets, tqdm.auto falls back to a text bar and warns; the text bar is fine.
    warnings.filterwarnings("ignore", message="IProgress not found")
    from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(progress: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar, or a silent one when ``progress`` is False. tqdm reads ``TQDM_*`` variables only for
    arguments a caller leaves out, so ``disable`` is passed only to switch the bar off."""
    return tqdm(**kwargs) if progress else tqdm(disable=True, **kwargs)
