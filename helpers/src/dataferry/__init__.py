"""dataferry: get training data from cloud storage to the GPU fast, the first time and every epoch.

Modules, lowest floor first: ``sources`` (where bytes live), ``mounts`` (gcsfuse and Drive
mounts), ``lab`` (the offline cloud for tests and lessons), ``cli`` (the ``dataferry`` command).
"""

__version__ = "0.1.0"
