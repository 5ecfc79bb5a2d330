"""Stage gs://BUCKET/PREFIX into the cache at CACHE (STORAGE_EMULATOR_HOST points at the lab)."""

import sys

from dataferry import Cache, GCSSource, stage

bucket, prefix, root, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
report = stage(GCSSource(bucket, prefix), Cache(root), workers=workers, progress=False)
sys.exit(1 if report.failures else 0)
