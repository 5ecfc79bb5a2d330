"""Which errors of a source are worth retrying, and the one retry policy of listings and fills."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dataferry.sources.base import SourceError

if TYPE_CHECKING:
    from google.api_core.retry import Retry
    from google.api_core.retry_async import AsyncRetry

__all__ = ["is_transient", "retry_policy", "retry_policy_async", "Attempts"]

BACKOFF = {"initial": 0.1, "maximum": 5.0, "multiplier": 2.0}  # seconds: the first pause, the longest, the growth
_TRANSIENT_ERRNOS = {errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                     errno.EPIPE, errno.EAGAIN}


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: 408/429/5xx, resets, timeouts, a FUSE mount that blinked."""
    import http.client

    import requests
    import urllib3
    from google.api_core import exceptions as gexc

    try:
        from google.cloud.storage.exceptions import InvalidResponse
    except ImportError:  # google-cloud-storage < 3
        from google.resumable_media import InvalidResponse  # type: ignore[no-redef]

    if isinstance(exc, gexc.GoogleAPICallError):
        return getattr(exc, "code", None) in (408, 429, 500, 502, 503, 504)
    if isinstance(exc, InvalidResponse):
        status = getattr(exc.response, "status_code", None)
        return status in (408, 429, 500, 502, 503, 504)
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                        urllib3.exceptions.ProtocolError, urllib3.exceptions.TimeoutError,
                        urllib3.exceptions.NewConnectionError, http.client.HTTPException)):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return False


def retry_policy(deadline_s: float, on_error: Callable[[BaseException], None],
                 predicate: Callable[[BaseException], bool] = is_transient) -> Retry:
    """The one retry policy of listings and fills: backoff from 0.1 s to 5 s for ``deadline_s``,
    retrying what ``predicate`` calls transient; ``on_error`` sees every failed attempt."""
    from google.api_core.retry import Retry

    return Retry(predicate=predicate, timeout=deadline_s, on_error=on_error, **BACKOFF)


class Attempts:
    """Counts the failed attempts of one retried call, and says how it ended."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.t0 = time.monotonic()

    def __call__(self, exc: BaseException) -> None:
        self.errors.append(exc)

    def gave_up(self, what: str, cause: BaseException | None, how: str = "kept failing for") -> SourceError:
        """The error to raise: the real time spent and every attempt made, the last one included."""
        n = len(self.errors) + 1
        return SourceError(f"{what} {how} {time.monotonic() - self.t0:.0f} s ({n} attempt{'s' * (n != 1)}; "
                           f"last error: {cause!r}). Check the connection and try again")


def retry_policy_async(deadline_s: float, on_error: Callable[[BaseException], None],
                       predicate: Callable[[BaseException], bool] = is_transient) -> AsyncRetry:
    """:func:`retry_policy` for coroutines: the same backoff and deadline, awaited on an event loop."""
    from google.api_core.retry_async import AsyncRetry

    return AsyncRetry(predicate=predicate, timeout=deadline_s, on_error=on_error, **BACKOFF)
