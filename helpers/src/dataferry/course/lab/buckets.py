"""What the lab's GCS holds and has served: clients, buckets, synthetic datasets, and the server's
request log (which objects were downloaded, how often)."""

from __future__ import annotations

import contextlib
import re
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataferry.course.lab.datasets import LogNormal, SyntheticDataset, plan_dataset
from dataferry.course.lab.errors import BucketNotFound, LabNotRunning

__all__ = ["LabBuckets"]

_ACCESS_LINE = re.compile(r'\\"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+\\" (?P<status>\d{3})')
_MEDIA_PATH = re.compile(r"^/(?P<kind>download/)?storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>.+)$")


class LabBuckets:
    """The :class:`~dataferry.course.lab.Lab` methods for its buckets and its request log."""

    if TYPE_CHECKING:  # what they use of the Lab
        state_dir: Path

        @property
        def endpoint(self) -> str: ...

        @property
        def direct_endpoint(self) -> str: ...

        @property
        def state(self) -> dict[str, Any]: ...

    def client(self, direct: bool = False) -> Any:
        """An anonymous google-cloud-storage ``Client`` for the lab (shaped unless ``direct``)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        url = self.direct_endpoint if direct else self.endpoint
        return storage.Client(project="dataferry-lab", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": url})

    def create_bucket(self, name: str):
        """Create a lab bucket (no error if it exists) and return it."""
        from google.api_core.exceptions import Conflict

        client = self.client(direct=True)
        with contextlib.suppress(Conflict):
            client.create_bucket(name)
        return client.bucket(name)

    def bucket(self, name: str, direct: bool = False):
        """An existing lab bucket; :class:`BucketNotFound` names the buckets there are."""
        from google.api_core.exceptions import NotFound

        client = self.client(direct=direct)
        try:
            return client.get_bucket(name)
        except NotFound:
            have = ", ".join(b.name for b in self.client(direct=True).list_buckets()) or "none"
            raise BucketNotFound(f"lab bucket {name!r} does not exist (buckets: {have}); create it with "
                                 f"lab.create_bucket({name!r})") from None

    def empty_bucket(self, name: str):
        """A lab bucket of that name (created if missing) with nothing in it: an earlier, larger run's objects
        would otherwise be listed too. Any number of objects, deleted in parallel."""
        from concurrent.futures import ThreadPoolExecutor

        bucket = self.create_bucket(name)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda blob: blob.delete(), bucket.list_blobs()))
        return bucket

    def delete_bucket(self, name: str) -> None:
        """Delete a lab bucket and everything in it (any number of objects)."""
        self.bucket(name, direct=True)  # a missing bucket is an error here, named
        self.empty_bucket(name).delete()

    def make_dataset(self, bucket: str, n_files: int, size: int | LogNormal, *, create: bool = True,
                     **plan: Any) -> SyntheticDataset:
        """Upload a synthetic dataset (see :func:`plan_dataset`) to a lab bucket, unshaped."""
        b = self.create_bucket(bucket) if create else self.bucket(bucket, direct=True)
        return plan_dataset(n_files, size, **plan).upload(b)

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request fake-gcs-server has answered so far, as (method, path?query, status)."""
        state = self.state  # not _require(): its health check would add a request of its own
        if not state:
            raise LabNotRunning(f"no lab is running for {self.state_dir}: start one with `dataferry lab up`")
        logfile = Path(state["run_dir"]) / "logs" / "fake-gcs-server.log"
        text, deadline = logfile.read_text(errors="replace"), time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the server logs a request after its last byte went: let it catch up
            time.sleep(0.05)
            again = logfile.read_text(errors="replace")
            if again == text:
                break
            text = again
        out = []
        for m in _ACCESS_LINE.finditer(text):
            out.append((m["method"], m["path"], int(m["status"])))
        return out

    def downloads(self, bucket: str) -> Counter[str]:
        """How many media downloads (full or ranged) of each object of ``bucket`` the server served."""
        counts: Counter[str] = Counter()
        for method, path, status in self.requests():
            url = urllib.parse.urlsplit(path)
            m = _MEDIA_PATH.match(url.path)
            if method == "GET" and m and m["bucket"] == bucket and status < 300 and (
                    "alt=media" in url.query or m["kind"] == "download"):
                counts[urllib.parse.unquote(m["object"])] += 1
        return counts
