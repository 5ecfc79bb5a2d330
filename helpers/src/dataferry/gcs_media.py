"""GCS media downloads over aiohttp: one object (or one byte range of it) into a writer.

The transport under :meth:`GCSSource.fetch_async`: the JSON API's media endpoint
(``/download/storage/v1/b/B/o/NAME?alt=media``, the one google-cloud-storage uses),
the client's own endpoint (``STORAGE_EMULATOR_HOST`` in the lab) and credentials (refreshed on a
thread when they expire; anonymous ones add nothing), bytes exactly as stored (no transcoding).
One attempt per call: errors come back as google-api-core's HTTP exceptions, or a builtin
``ConnectionError`` / ``TimeoutError`` for the link, so the caller's retry policy decides.
It is imported only when a download starts (aiohttp is not loaded by ``import dataferry``);
of dataferry's modules it imports only :mod:`dataferry.aio`.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse
from typing import Any

import aiohttp
import yarl
from google.api_core import exceptions

from dataferry import aio

__all__ = ["media_get", "MAX_CONNECTIONS"]

MAX_CONNECTIONS = 256  # per process; gcsfs's bulk get opens about as many
_READ = 1 << 20
_WRITE = 64 << 10  # packets are gathered up to this size before a write
_sessions: dict[int, Any] = {}
_refreshing: dict[int, asyncio.Lock] = {}


_parents: list[Any] = []


def _forget_after_fork() -> None:
    """A forked child has a loop of its own (:mod:`dataferry.aio`): the parent's sessions and locks
    are not its. They are kept, never collected, in the child: closing their connections there
    would take the sockets out of the epoll set the child shares with the parent, and the
    parent's next response on them would never arrive."""
    _parents.extend(_sessions.values())
    _sessions.clear()
    _refreshing.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _session() -> Any:
    loop = asyncio.get_running_loop()
    session = _sessions.get(id(loop))
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ttl_dns_cache=300)
        session = _sessions[id(loop)] = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                              trust_env=False)

        async def close() -> None:
            await session.close()

        aio.at_close(close)
    return session


async def _authorize(credentials: Any, url: str, headers: dict[str, str]) -> None:
    """Add the credentials' headers; a refresh (blocking HTTP) runs on a thread, once at a time."""
    if not credentials.valid:
        lock = _refreshing.setdefault(id(credentials), asyncio.Lock())
        async with lock:
            if not credentials.valid:
                from google.auth.transport.requests import Request

                await asyncio.get_running_loop().run_in_executor(
                    None, credentials.before_request, Request(), "GET", url, headers)
                return
    credentials.before_request(None, "GET", url, headers)  # valid: no request is made


async def media_get(client: Any, bucket: str, name: str, generation: str, out: Any, start: int = 0,
                    end: int | None = None, timeout: float | None = None, total: float | None = None) -> int:
    """Write bytes ``start``..``end`` (exclusive; None = to the end) of one object generation to
    ``out.write``; returns how many were written. ``timeout`` bounds connecting and each wait for
    bytes, ``total`` the whole call. Raises google-api-core's exception for an HTTP error status
    (``NotFound``: that generation is gone), ``ConnectionError`` or ``TimeoutError`` when the link fails.

    The live object is asked for on condition that it is still ``generation`` (the request any
    server answers cheapest: the emulator spends about a millisecond of CPU looking up a
    generation by number); when it is not (HTTP 412, or a server that ignores the condition
    answers with another ``X-Goog-Generation``), that generation by number: a noncurrent
    version of a versioned bucket, or ``NotFound``."""
    path = f"{client.api_endpoint}/download/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
    headers = {"Accept-Encoding": "gzip"}  # the stored bytes, never transcoded, so the crc32c matches
    if start or end is not None:
        headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    await _authorize(client._credentials, path, headers)
    began = time.monotonic()
    n = await _get(f"{path}&ifGenerationMatch={generation}", generation, headers, out, timeout, total)
    if n is not None:
        return n
    left = None if total is None else max(total - (time.monotonic() - began), 0.001)
    return await _get(f"{path}&generation={generation}", None, headers, out, timeout, left) or 0


async def _get(url: str, generation: str | None, headers: dict[str, str], out: Any, timeout: float | None,
               total: float | None) -> int | None:
    """One GET into ``out``; None, before any byte is written, when the live object is not ``generation``."""
    limits = aiohttp.ClientTimeout(total=total, sock_connect=timeout, sock_read=timeout)
    n = 0
    try:  # the URL is quoted already: not parsed and re-quoted per request
        async with _session().get(yarl.URL(url, encoded=True), headers=headers, timeout=limits) as response:
            if generation is not None and (response.status == 412 or (
                    response.status < 300 and response.headers.get("X-Goog-Generation", generation) != generation)):
                return None
            if response.status >= 400:
                body = (await response.read())[:500].decode("utf-8", "replace")
                raise exceptions.from_http_status(response.status, f"GET {url}: {body}")
            if "Range" in headers and response.status != 206:
                raise ConnectionError(f"GET {url}: asked for a range, got the whole object (HTTP {response.status})")
            held = bytearray()  # packets gathered into larger writes; written even when the link fails
            try:
                async for chunk in response.content.iter_chunked(_READ):
                    if len(chunk) >= _WRITE or len(held) + len(chunk) >= _WRITE:
                        if held:
                            out.write(bytes(held))
                            n += len(held)
                            held.clear()
                        out.write(chunk)  # a large chunk goes as it is: no copy
                        n += len(chunk)
                    else:
                        held += chunk
            finally:
                if held:
                    out.write(bytes(held))
                    n += len(held)
    except aiohttp.ClientError as e:
        raise ConnectionError(f"GET {url} failed after {n} bytes: {e!r}") from e
    except asyncio.TimeoutError as e:
        raise TimeoutError(f"GET {url}: timed out after {n} bytes (no bytes for {timeout} s, "
                           f"or {total} s in all)") from e
    return n
