"""A small client for toxiproxy's HTTP API: proxies and toxics (shaping and faults)."""

from __future__ import annotations

from typing import Any

import requests

from dataferry.course.lab.errors import LabError

__all__ = ["Toxiproxy"]


class Toxiproxy:
    """Talks to a toxiproxy server's API at ``http://host:port``."""

    def __init__(self, api: str, timeout: float = 5.0) -> None:
        self.api = api.rstrip("/")
        self.timeout = timeout
        self._http = requests.Session()

    def _call(self, method: str, path: str, json: Any = None) -> Any:
        try:
            r = self._http.request(method, self.api + path, json=json, timeout=self.timeout)
        except requests.RequestException as e:
            raise LabError(f"toxiproxy API at {self.api} did not answer ({e.__class__.__name__}); is the lab up?") from e
        if r.status_code >= 400:
            raise LabError(f"toxiproxy {method} {path} failed: HTTP {r.status_code} {r.text.strip()}")
        return r.json() if r.content else None

    def version(self) -> str:
        return self._http.get(self.api + "/version", timeout=self.timeout).text.strip()

    def create_proxy(self, name: str, listen: str, upstream: str) -> dict:
        return self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})

    def proxies(self) -> dict:
        return self._call("GET", "/proxies")

    def toxics(self, proxy: str) -> list[dict]:
        return self._call("GET", f"/proxies/{proxy}/toxics")

    def add_toxic(self, proxy: str, toxic: dict) -> dict:
        """Add one toxic, e.g. ``{"name": "reset", "type": "reset_peer", "toxicity": 0.2, "attributes": {}}``."""
        return self._call("POST", f"/proxies/{proxy}/toxics", toxic)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def replace_toxics(self, proxy: str, toxics: list[dict], prefix: str) -> None:
        """Remove the toxics whose name starts with ``prefix``, then add ``toxics``."""
        for t in self.toxics(proxy):
            if t["name"].startswith(prefix):
                self.remove_toxic(proxy, t["name"])
        for t in toxics:
            self.add_toxic(proxy, t)

    def __repr__(self) -> str:
        return f"<Toxiproxy {self.api}>"
