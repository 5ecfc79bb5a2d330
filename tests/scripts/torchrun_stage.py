"""Run under torchrun: each rank stages its share of gs://BUCKET/PREFIX into its own cache, then
the ranks exchange what they staged over gloo. Rank 0 writes the gathered lists to OUT as JSON."""

import json
import os
import sys

import torch.distributed as dist

from dataferry import Cache, GCSSource, stage

bucket, prefix, root, out = sys.argv[1:5]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cache = Cache(os.path.join(root, f"rank{rank}"))
source = GCSSource(bucket, prefix)
report = stage(source, cache, rank=rank, world_size=world, progress=False)
mine = sorted(row["name"] for row in cache.entries())
gathered = [None] * world
dist.all_gather_object(gathered, {"rank": rank, "world": world, "names": mine, "fetched": report.fetched,
                                  "failures": report.failures})
if rank == 0:
    with open(out, "w") as f:
        json.dump(gathered, f)
dist.destroy_process_group()
