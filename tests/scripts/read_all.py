"""Wait for GO to appear, then read every object of gs://BUCKET/PREFIX through the cache at CACHE,
in a shuffled order, and write 'name crc32c' lines to OUT."""

import os
import random
import sys
import time

import google_crc32c

from dataferry import Cache, GCSSource

bucket, prefix, root, go, out = sys.argv[1:6]
source = GCSSource(bucket, prefix)
entries = list(source.list())
random.Random(os.getpid()).shuffle(entries)
cache = Cache(root)
while not os.path.exists(go):
    time.sleep(0.01)
with open(out, "w") as f:
    for e in entries:
        f.write(f"{e.name} {google_crc32c.value(cache.read(source, e))}\n")
