"""Tests for dataferry.harness.runtime: region detection against real loopback servers, and capture()."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dataferry.harness.runtime import Region, Runtime, capture, detect_region, in_colab

ZONE_PATH = "/computeMetadata/v1/instance/zone"


@pytest.fixture(autouse=True)
def _no_region_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAFERRY_REGION", raising=False)


@contextlib.contextmanager
def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _metadata_handler(send_flavor: bool, seen: list[str | None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Metadata-Flavor"))
            if self.headers.get("Metadata-Flavor") != "Google":
                self.send_error(403, "Missing Metadata-Flavor:Google header")
                return
            if self.path != ZONE_PATH:
                self.send_error(404)
                return
            body = b"projects/123/zones/europe-west4-b"
            self.send_response(200)
            if send_flavor:
                self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _metadata_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metadata_server_gives_zone_and_region() -> None:
    seen: list[str | None] = []
    with _serve(_metadata_handler(send_flavor=True, seen=seen)) as server:
        got = detect_region(metadata_url=_metadata_url(server))
    assert got == Region("europe-west4", "europe-west4-b", "metadata")
    assert seen == ["Google"]
    assert str(got) == "europe-west4 (zone europe-west4-b, from metadata)"


def test_metadata_answer_without_flavor_header_is_not_trusted() -> None:
    seen: list[str | None] = []
    with _serve(_metadata_handler(send_flavor=False, seen=seen)) as server:
        got = detect_region(metadata_url=_metadata_url(server))
    assert seen == ["Google"]  # it was asked and answered 200, yet not believed
    assert got == Region("unknown", None, "unknown")


def test_nothing_listening_is_unknown_fast() -> None:
    t0 = time.monotonic()
    got = detect_region(metadata_url=f"http://127.0.0.1:{_free_port()}/computeMetadata/v1", timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0
    assert got == Region("unknown", None, "unknown")


def test_server_that_never_answers_is_bounded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        got = detect_region(metadata_url=f"http://127.0.0.1:{port}/computeMetadata/v1", timeout_s=1.0)
        elapsed = time.monotonic() - t0
    assert elapsed < 2.0
    assert got.source == "unknown" and got.region == "unknown"


def test_unresolvable_host_is_bounded() -> None:
    t0 = time.monotonic()
    got = detect_region(metadata_url="http://metadata.invalid/computeMetadata/v1", timeout_s=1.0)
    assert time.monotonic() - t0 < 2.0
    assert got == Region("unknown", None, "unknown")


def test_override_env_and_lab_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{_free_port()}/computeMetadata/v1"
    assert detect_region("asia-east1", metadata_url=dead) == Region("asia-east1", None, "override")
    monkeypatch.setenv("DATAFERRY_REGION", "us-east1")
    assert detect_region(metadata_url=dead) == Region("us-east1", None, "override")
    assert detect_region("asia-east1", metadata_url=dead).region == "asia-east1"  # argument beats env
    monkeypatch.delenv("DATAFERRY_REGION")
    assert detect_region(lab_profile="cross-continent", metadata_url=dead) == Region(
        "lab:cross-continent", None, "lab"
    )


def test_ip_lookup_used_only_when_asked() -> None:
    class Geo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"region": "Iowa", "country": "US"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    dead = f"http://127.0.0.1:{_free_port()}/computeMetadata/v1"
    with _serve(Geo) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/json"
        got = detect_region(metadata_url=dead, ip_lookup_url=url)
        without = detect_region(metadata_url=dead)
    assert got == Region("Iowa", None, "ip-lookup")
    assert without.source == "unknown"


def test_capture_records_this_machine(tmp_path) -> None:
    rt = capture(str(tmp_path), region=Region("lab:unshaped", None, "lab"))
    assert isinstance(rt, Runtime)
    assert rt.ram_bytes > 0
    assert rt.cpus >= 1
    assert rt.disk_free_bytes > 0
    assert rt.kernel
    assert rt.versions["google-cloud-storage"] is not None
    assert rt.versions["dataferry"] is not None
    assert rt.crc32c_implementation in ("c", "python")
    assert rt.colab is False
    if not rt.cuda_devices:
        assert rt.accelerator in ("cpu", "tpu")
        if rt.accelerator == "cpu":
            assert rt.kind == "local-cpu"
    else:
        assert rt.kind == "local-gpu"
    d = json.loads(json.dumps(rt.to_dict()))
    assert d["region"] == {"region": "lab:unshaped", "zone": None, "source": "lab"}
    assert d["ram_bytes"] == rt.ram_bytes
    assert d["kind"] == rt.kind
    assert "Runtime(" in repr(rt)


def test_capture_reports_given_gcsfuse_binary(tmp_path) -> None:
    fake = tmp_path / "gcsfuse"
    fake.write_text("#!/bin/sh\necho 'gcsfuse version 9.9.9 (Go version go1.22)'\necho second line\n")
    fake.chmod(0o755)
    rt = capture(str(tmp_path), region=Region("unknown", None, "unknown"), gcsfuse=str(fake))
    assert rt.gcsfuse == "gcsfuse version 9.9.9 (Go version go1.22)"
    missing = capture(str(tmp_path), region=Region("unknown", None, "unknown"), gcsfuse=str(tmp_path / "nope"))
    assert missing.gcsfuse is None


def test_kind_labels() -> None:
    base = dict(cuda_devices=[], cpus=1, ram_bytes=1, disk_free_bytes=1, kernel="k", python="3")
    assert Runtime(colab=True, accelerator="cuda:Tesla T4", **base).kind == "colab-gpu"
    assert Runtime(colab=False, accelerator="tpu", **base).kind == "local-tpu"
    assert Runtime(colab=False, accelerator="cpu", **base).kind == "local-cpu"


def test_not_in_colab() -> None:
    assert in_colab() is False


def test_tpu_found_from_colab_variables_and_vfio_groups(monkeypatch, tmp_path) -> None:
    """v5e/v6e TPU hosts expose /dev/vfio/N, older ones /dev/accel*; Colab sets TPU_ACCELERATOR_TYPE."""
    from dataferry.harness.runtime import _TPU_ENV_VARS, _tpu

    for var in _TPU_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (dev / "vfio" / "vfio").touch()  # the container device alone is no TPU
    assert _tpu(str(dev)) is None
    (dev / "vfio" / "0").touch()
    assert _tpu(str(dev)) == "tpu"
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    assert _tpu(str(tmp_path / "nothing")) == "tpu:v5litepod-1"
    base = dict(cuda_devices=[], cpus=8, ram_bytes=48 * 2**30, disk_free_bytes=0, kernel="k", python="3.13")
    rt = Runtime(colab=True, accelerator="tpu:v5litepod-1", **base)
    assert rt.kind == "colab-tpu" and rt.tier == "high-RAM" and rt.to_dict()["tier"] == "high-RAM"
    assert Runtime(colab=False, accelerator="cpu", **base).tier is None
    assert Runtime(colab=True, accelerator="cpu", **{**base, "ram_bytes": 12 * 2**30}).tier == "standard"


def test_colocation_of_a_runtime_and_a_bucket():
    from dataferry.harness.runtime import colocation

    assert colocation("us-central1", "US-CENTRAL1") == "same region"
    assert colocation("us-east1", "US") == "inside the bucket's multi-region"
    assert colocation("us-east1", "NAM4") == "inside the bucket's multi-region"
    assert colocation("us-west1", "NAM4") == "another region"
    assert colocation("europe-west4", "US") == "another region"
    assert colocation("unknown", "US") == colocation("lab:colocated", "US") == colocation("us-east1", "") == "unknown"


def test_colocation_says_unknown_for_a_place_a_geo_ip_lookup_gives():
    """A geo-IP answer is a state or a country, not a cloud region: it can place a runtime neither inside nor
    outside a bucket's region."""
    from dataferry.harness.runtime import colocation

    assert colocation("Iowa, US", "US-CENTRAL1") == colocation("iowa", "US") == "unknown"
    assert colocation("us-central1", "US-CENTRAL1") == "same region"
    assert colocation("europe-west4", "US-CENTRAL1") == "another region"
    assert colocation("lab:colocated", "US") == "unknown"
