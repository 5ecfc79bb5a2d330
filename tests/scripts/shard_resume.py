"""Train-like loop over gs://BUCKET/PREFIX shards with ShardLoader (2 workers, batches of 4) in EPOCH. After every
batch, write the keys given so far and the loader's state to STATE (atomically, as a checkpoint would); with
KILL_AFTER > 0, SIGKILL this process after that many batches. On start, continue from STATE if it exists."""

import json
import os
import signal
import sys
from pathlib import Path

from dataferry import Cache, GCSSource
from dataferry.shards import ShardDataset, ShardLoader

bucket, prefix, root, state_path, epoch, kill_after = sys.argv[1:3] + sys.argv[3:5] + list(map(int, sys.argv[5:7]))
state_path = Path(state_path)
loader = ShardLoader(ShardDataset(GCSSource(bucket, prefix), Cache(root), shuffle=7, seed=3), batch_size=4,
                     num_workers=2, collate_fn=lambda batch: [s["__key__"] for s in batch])
keys: list[str] = []
if state_path.exists():
    saved = json.loads(state_path.read_text())
    loader.load_state_dict(saved["state"])
loader.set_epoch(epoch)
for batch in loader:
    keys += batch
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"state": loader.state_dict(), "keys": keys}))
    os.replace(tmp, state_path)
    if loader.batches == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps(keys))
