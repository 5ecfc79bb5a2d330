"""The offline lab: real fake-gcs-server behind real toxiproxy, and real gcsfuse mounts of it.

::

    client / gcsfuse --> toxiproxy (region profile: latency, bandwidth, faults) --> fake-gcs-server
      endpoint: http://127.0.0.1:<proxy port>              direct: http://127.0.0.1:<gcs port>

A lab is described by a state file (``state.json`` in its state folder), so ``dataferry lab up``
in one process and ``dataferry lab down`` in another see the same lab. Everything the lab starts
carries ``DATAFERRY_LAB_ID`` in its environment and everything it writes lives in one run folder,
so ``down`` can prove it left nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import requests
from filelock import FileLock

from dataferry import mounts
from dataferry.course.lab.buckets import LabBuckets
from dataferry.course.lab.errors import LabError, LabNotRunning, ToolError
from dataferry.course.lab.processes import HOST, LAB_ID_ENV, alive, check_port_free, free_port, lab_processes, stop
from dataferry.course.lab.profiles import Profile, get_profile
from dataferry.course.lab.tools import ensure_tool, tools_dir
from dataferry.course.lab.toxiproxy import Toxiproxy

__all__ = ["Lab", "default_state_dir", "lab_processes"]

log = logging.getLogger("dataferry.lab")

PROXY = "gcs"
PROFILE_PREFIX = "profile_"
START_TIMEOUT_S = 30.0


def default_state_dir() -> Path:
    """``$DATAFERRY_LAB_STATE`` or ``~/.cache/dataferry/lab``."""
    env = os.environ.get("DATAFERRY_LAB_STATE")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "dataferry" / "lab"


class Lab(LabBuckets):
    """A handle on one lab, running or not, described by the state file in ``state_dir``.

    >>> lab = Lab().up(profile="same-continent")   # builds tools the first time
    >>> lab.client().list_buckets()
    >>> lab.down()
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, tools: str | os.PathLike[str] | None = None):
        self.state_dir = Path(state_dir).absolute() if state_dir else default_state_dir()
        self.tools = Path(tools).absolute() if tools else tools_dir()
        self._state_file = self.state_dir / "state.json"
        self._lock = FileLock(str(self.state_dir / ".lock")) if self.state_dir.exists() else None
        self._mounts: dict[str, mounts.GcsfuseMount] = {}

    # -- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        """The recorded state, or {} when no lab was started here."""
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self, state: dict[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self._state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            self._lock = FileLock(str(self.state_dir / ".lock"))
        with self._lock:
            yield

    def _require(self) -> dict[str, Any]:
        state = self.state
        if not state or not self.healthy(state):
            raise LabNotRunning(f"no lab is running for {self.state_dir}: start one with `dataferry lab up`")
        return state

    # -- health --------------------------------------------------------------------------------

    def healthy(self, state: dict[str, Any] | None = None) -> bool:
        """All lab processes alive and both servers answering."""
        state = self.state if state is None else state
        if not state:
            return False
        for p in state["processes"].values():
            if not alive(p["pid"], p["exe"]):
                return False
        try:
            requests.get(f"http://{HOST}:{state['gcs_port']}/storage/v1/b", timeout=2).raise_for_status()
            requests.get(f"http://{HOST}:{state['api_port']}/version", timeout=2).raise_for_status()
        except requests.RequestException:
            return False
        return True

    @property
    def running(self) -> bool:
        return self.healthy()

    # -- up / down -----------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def private(cls, profile: str | Profile = "unshaped", gcsfuse: bool = True) -> Iterator[Lab]:
        """A lab of its own (never the course's running one) for a ``with`` block: started in a new state
        folder, then stopped, and its run and state folders removed, however the block ends."""
        lab = cls(state_dir=tempfile.mkdtemp(prefix="dataferry-lab-state-"))
        try:
            yield lab.up(profile=profile, gcsfuse=gcsfuse)
        finally:
            lab.down()  # raises, keeping the state folder for `dataferry lab down`, if a mount will not go
            shutil.rmtree(lab.state_dir, ignore_errors=True)

    def up(self, profile: str | Profile = "unshaped", port: int | None = None, gcsfuse: bool = True) -> Lab:
        """Start the lab (or reuse the one running here), cleaning up after a crashed one first.

        ``port`` fixes the client endpoint's port (default: a free one). ``gcsfuse=False`` skips
        building gcsfuse. Returns ``self``.
        """
        wanted = get_profile(profile)
        with self._locked():
            state = self.state
            if state and self.healthy(state) and (port is None or port == state["proxy_port"]):
                log.info("lab already up at %s", state["endpoint"])
                self._apply_profile(state, wanted)
                return self
            if state:
                for line in self._cleanup(state):
                    log.info("cleaned up after the previous lab: %s", line)
            self._start(wanted, port, gcsfuse)
        return self

    def _start(self, profile: Profile, port: int | None, want_gcsfuse: bool) -> None:
        if port is not None:
            check_port_free(port)
        fake_gcs, fake_gcs_version = ensure_tool("fake-gcs-server", self.tools)
        toxiproxy, toxiproxy_version = ensure_tool("toxiproxy-server", self.tools)
        gcsfuse: dict[str, Any] = {"available": False, "why": "not requested (gcsfuse=False)"}
        if want_gcsfuse:
            ok, why = mounts.fuse_status()
            if ok:
                try:
                    log.info("building gcsfuse if needed (the first build takes a few minutes)")
                    path, version = ensure_tool("gcsfuse", self.tools)
                    gcsfuse = {"available": True, "path": str(path), "version": version, "why": ""}
                except ToolError as e:
                    gcsfuse = {"available": False, "why": str(e)}
            else:
                gcsfuse = {"available": False, "why": why}
            if not gcsfuse["available"]:
                log.warning("gcsfuse is unavailable: %s (the rest of the lab works)", gcsfuse["why"])

        lab_id = uuid.uuid4().hex[:12]
        run_dir = Path(tempfile.mkdtemp(prefix=f"dataferry-lab-{lab_id}-"))
        (run_dir / "logs").mkdir()
        gcs_port, api_port = free_port(), free_port()
        proxy_port = port or free_port()
        endpoint = f"http://{HOST}:{proxy_port}"
        state: dict[str, Any] = {
            "id": lab_id, "run_dir": str(run_dir), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "endpoint": endpoint, "gcs_port": gcs_port, "proxy_port": proxy_port, "api_port": api_port,
            "processes": {}, "tools": {"fake-gcs-server": fake_gcs_version, "toxiproxy-server": toxiproxy_version},
            "gcsfuse": gcsfuse, "profile": None, "mounts": {},
        }
        env = {**os.environ, LAB_ID_ENV: lab_id}
        commands = {
            "fake-gcs-server": [
                str(fake_gcs), "-scheme", "http", "-host", HOST, "-port", str(gcs_port),
                # Clients dial the proxy, so that is the public host; XML-API reads 404 otherwise.
                "-public-host", f"{HOST}:{proxy_port}", "-external-url", endpoint,
                # info logs one access-log line per request: lab.requests() counts them.
                "-backend", "memory", "-log-level", "info",
            ],
            "toxiproxy-server": [str(toxiproxy), "-host", HOST, "-port", str(api_port)],
        }
        try:
            for name, cmd in commands.items():
                logf = open(run_dir / "logs" / f"{name}.log", "wb")
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=env)
                logf.close()
                state["processes"][name] = {"pid": proc.pid, "exe": cmd[0]}
                self._write_state(state)
            self._wait_ready(state)
            tp = Toxiproxy(f"http://{HOST}:{api_port}")
            tp.create_proxy(PROXY, f"{HOST}:{proxy_port}", f"{HOST}:{gcs_port}")
            self._apply_profile(state, profile)
        except BaseException:
            self._cleanup(state)
            raise
        log.info("lab up: endpoint %s, profile %s", endpoint, profile.name)

    def _wait_ready(self, state: dict[str, Any]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        checks = {
            "fake-gcs-server": f"http://{HOST}:{state['gcs_port']}/storage/v1/b",
            "toxiproxy-server": f"http://{HOST}:{state['api_port']}/version",
        }
        for name, url in checks.items():
            p = state["processes"][name]
            while True:
                if not alive(p["pid"], p["exe"]):
                    logfile = Path(state["run_dir"]) / "logs" / f"{name}.log"
                    raise LabError(f"{name} exited at start-up; its log says:\n{mounts.log_tail(logfile, 10)}")
                with contextlib.suppress(requests.RequestException):
                    if requests.get(url, timeout=1).ok:
                        break
                if time.monotonic() > deadline:
                    raise LabError(f"{name} did not answer at {url} within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.05)

    def down(self) -> list[str]:
        """Unmount every lab mount, stop every lab process, remove the run folder. Returns what it did."""
        with self._locked():
            state = self.state
            if not state:
                return []
            return self._cleanup(state)

    def _cleanup(self, state: dict[str, Any]) -> list[str]:
        done: list[str] = []
        run_dir = Path(state["run_dir"])
        for m in list(self._mounts.values()):
            with contextlib.suppress(mounts.MountError):
                m.unmount(timeout=10)
                done.append(f"unmounted {m.mountpoint}")
        self._mounts.clear()
        points = set(state.get("mounts", {})) | set(mounts.fuse_mounts_under(run_dir) if run_dir.exists() else [])
        for point in sorted(points):
            if mounts.is_mounted(point):
                mounts.unmount(point, timeout=10)
                done.append(f"unmounted {point}")
        for name, m in state.get("mounts", {}).items():
            if stop(m["pid"], state["gcsfuse"].get("path")):
                done.append(f"stopped gcsfuse (pid {m['pid']}) of {name}")
        for name, p in state.get("processes", {}).items():
            if stop(p["pid"], p["exe"]):
                done.append(f"stopped {name} (pid {p['pid']})")
            else:
                done.append(f"{name} (pid {p['pid']}) was already gone")
        for pid in lab_processes(state["id"]):
            stop(pid, None)
            done.append(f"stopped stray lab process {pid}")
        if run_dir.exists():
            left = mounts.fuse_mounts_under(run_dir)
            if left:
                raise LabError(f"{', '.join(left)} still mounted; not removing {run_dir}. Unmount with `umount -l`.")
            shutil.rmtree(run_dir)
            done.append(f"removed {run_dir}")
        self._state_file.unlink(missing_ok=True)
        return done

    # -- profiles ------------------------------------------------------------------------------

    def _apply_profile(self, state: dict[str, Any], profile: Profile) -> None:
        Toxiproxy(f"http://{HOST}:{state['api_port']}").replace_toxics(PROXY, profile.toxics(), PROFILE_PREFIX)
        state["profile"] = {"name": profile.name, "rtt_ms": profile.rtt_ms, "bandwidth_MBps": profile.bandwidth_MBps}
        self._write_state(state)

    def set_profile(self, profile: str | Profile) -> Profile:
        """Switch the region profile; it applies to new connections at once, nothing restarts."""
        p = get_profile(profile)
        with self._locked():
            self._apply_profile(self._require(), p)
        log.info("profile %s", p)
        return p

    @contextlib.contextmanager
    def using_profile(self, profile: str | Profile) -> Iterator[Profile]:
        """Use ``profile`` inside a ``with`` block and restore the previous one after."""
        before = self.profile
        try:
            yield self.set_profile(profile)
        finally:
            self.set_profile(before)

    @property
    def profile(self) -> Profile:
        p = self._require()["profile"]
        return Profile(p["name"], p["rtt_ms"], p["bandwidth_MBps"])

    @property
    def toxiproxy(self) -> Toxiproxy:
        """The toxiproxy API, e.g. to inject faults on the ``gcs`` proxy."""
        return Toxiproxy(f"http://{HOST}:{self._require()['api_port']}")

    # -- endpoints (clients, buckets and the request log: LabBuckets) ---------------------------

    @property
    def endpoint(self) -> str:
        """Where clients connect (through toxiproxy, shaped by the profile)."""
        return self._require()["endpoint"]

    @property
    def run_dir(self) -> Path:
        """The running lab's folder (logs, mounts, file caches, local copies): :meth:`down` removes it."""
        return Path(self._require()["run_dir"])

    @property
    def direct_endpoint(self) -> str:
        """fake-gcs-server itself, unshaped: for setting up buckets quickly, not for measuring."""
        return f"http://{HOST}:{self._require()['gcs_port']}"

    def env(self) -> dict[str, str]:
        """Environment for programs that should talk to the lab (google-cloud-storage honours it)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def gcloud_env(self) -> dict[str, str]:
        """Environment for the Google Cloud CLI (``gcloud storage cp``) to read the lab through its shaped
        endpoint, without credentials, keeping its settings in the lab's run folder (never the user's own;
        removed by :meth:`down`)."""
        return {"CLOUDSDK_CONFIG": str(self.run_dir / "gcloud"), "CLOUDSDK_CORE_PROJECT": "dataferry-lab",
                "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": self.endpoint.rstrip("/") + "/storage/v1/",
                "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true", "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}

    # -- gcsfuse -------------------------------------------------------------------------------

    def mount(self, bucket: str, *, file_cache: bool = False, mountpoint: str | os.PathLike[str] | None = None,
              timeout: float = 60.0, config: dict[str, Any] | None = None,
              extra_args: Sequence[str] = ()) -> mounts.GcsfuseMount:
        """Mount a lab bucket with the lab's gcsfuse (through toxiproxy), optionally with its file cache;
        ``config`` and ``extra_args`` go to :func:`dataferry.mounts.mount_gcsfuse` (gcsfuse's own knobs).

        The mount is recorded, so ``down`` unmounts it even from another process.
        """
        state = self._require()
        if not state["gcsfuse"]["available"]:
            raise LabError(f"gcsfuse is unavailable in this lab: {state['gcsfuse']['why']}")
        self.bucket(bucket, direct=True)
        run_dir = Path(state["run_dir"])
        tag = uuid.uuid4().hex[:8]
        point = Path(mountpoint).absolute() if mountpoint else run_dir / "mnt" / f"{bucket}-{tag}"
        cache_dir = run_dir / "gcsfuse-cache" / tag if file_cache else None
        m = mounts.mount_gcsfuse(
            bucket, point, endpoint=state["endpoint"], cache_dir=cache_dir, anonymous=True,
            gcsfuse=state["gcsfuse"]["path"], env={LAB_ID_ENV: state["id"]},
            log_path=run_dir / "logs" / f"gcsfuse-{bucket}-{tag}.log", timeout=timeout, config=config,
            extra_args=extra_args,
        )
        with self._locked():
            state = self.state
            state["mounts"][str(m.mountpoint)] = {"bucket": bucket, "pid": m.pid, "file_cache": file_cache,
                                                  "cache_dir": str(cache_dir) if cache_dir else None}
            self._write_state(state)
        self._mounts[str(m.mountpoint)] = m
        m.on_unmount = self._forget
        return m

    def _forget(self, m: mounts.GcsfuseMount) -> None:
        """After an unmount: the mount leaves the state, and its file cache (a copy of all it read) goes."""
        self._mounts.pop(str(m.mountpoint), None)
        if m.cache_dir is not None:
            shutil.rmtree(m.cache_dir, ignore_errors=True)
        with self._locked():
            state = self.state
            if state and state["mounts"].pop(str(m.mountpoint), None):
                self._write_state(state)

    def unmount(self, mount: mounts.GcsfuseMount | str | os.PathLike[str]) -> None:
        """Unmount a lab mount (a mount object or its mount point, e.g. one made by the CLI)."""
        if isinstance(mount, mounts.GcsfuseMount):
            mount.unmount()
            return
        point = str(Path(mount).absolute())
        if point in self._mounts:
            self._mounts[point].unmount()
            return
        if not mounts.is_mounted(point) and point not in self.state.get("mounts", {}):
            raise LabError(f"{point} is not a mount of this lab ({self.state_dir}): nothing to unmount; "
                           "`dataferry lab status` lists its mounts")
        mounts.unmount(point)
        with self._locked():
            state = self.state
            entry = state.get("mounts", {}).pop(point, None) if state else None
            if entry:
                stop(entry["pid"], state["gcsfuse"].get("path"))
                if entry.get("cache_dir"):
                    shutil.rmtree(entry["cache_dir"], ignore_errors=True)
                self._write_state(state)

    # -- reporting -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What runs: endpoints, profile, tools, gcsfuse availability, mounts; ``up`` is False if none."""
        state = self.state
        if not state:
            return {"up": False, "state_dir": str(self.state_dir)}
        up = self.healthy(state)
        live_mounts = {p: m for p, m in state["mounts"].items() if mounts.is_mounted(p)}
        return {
            "up": up, "state_dir": str(self.state_dir), "id": state["id"], "endpoint": state["endpoint"],
            "direct_endpoint": f"http://{HOST}:{state['gcs_port']}",
            "toxiproxy_api": f"http://{HOST}:{state['api_port']}", "profile": state["profile"],
            "processes": {n: {**p, "alive": alive(p["pid"], p["exe"])} for n, p in state["processes"].items()},
            "tools": state["tools"], "gcsfuse": state["gcsfuse"], "mounts": live_mounts,
            "run_dir": state["run_dir"],
        }

    def __repr__(self) -> str:
        state = self.state
        if not state:
            return f"<Lab (down) state in {self.state_dir}>"
        p = state["profile"]["name"] if state.get("profile") else "?"
        health = "up" if self.healthy(state) else "not healthy"
        return f"<Lab {health} at {state['endpoint']}, profile lab:{p}, {len(state['mounts'])} mounts>"
