"""Read every file of the folder FOLDER through the cache at CACHE, in a shuffled order, over and over
(until killed), from THREADS threads."""

import os
import random
import sys
import threading

from dataferry import Cache, LocalSource

folder, root, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
source = LocalSource(folder)
entries = list(source.list())
cache = Cache(root)


def read_all(seed: int) -> None:
    order = entries[:]
    random.Random(seed).shuffle(order)
    for e in order:
        cache.read(source, e)


while True:
    pool = [threading.Thread(target=read_all, args=(os.getpid() + i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    cache.clear()
