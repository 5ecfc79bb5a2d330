"""The offline lab: the cloud side of the course, played by real programs on loopback.

fake-gcs-server (the GCS JSON and XML APIs) sits behind toxiproxy (region profiles: latency and
bandwidth, plus injected faults), and gcsfuse mounts its buckets for real. Nothing here reaches
Google; every figure measured here is labelled ``lab:<profile>``.

    >>> from dataferry.course.lab import Lab
    >>> lab = Lab().up(profile="cross-continent")
    >>> ds = lab.make_dataset("demo", n_files=100, size=1 << 20)
    >>> with lab.mount("demo") as m:
    ...     data = (m.mountpoint / ds.object_names[0]).read_bytes()
    >>> lab.down()
"""

from dataferry.course.lab.core import Lab, default_state_dir, lab_processes
from dataferry.course.lab.datasets import LogNormal, SyntheticDataset, plan_dataset, sample_bytes
from dataferry.course.lab.errors import BucketNotFound, LabError, LabNotRunning, ToolError
from dataferry.course.lab.profiles import PROFILES, Profile, get_profile
from dataferry.course.lab.tools import TOOLS, ensure_tool, tools_dir
from dataferry.course.lab.toxiproxy import Toxiproxy

__all__ = [
    "Lab", "default_state_dir", "lab_processes",
    "LogNormal", "SyntheticDataset", "plan_dataset", "sample_bytes",
    "BucketNotFound", "LabError", "LabNotRunning", "ToolError",
    "PROFILES", "Profile", "get_profile",
    "TOOLS", "ensure_tool", "tools_dir", "Toxiproxy",
]
