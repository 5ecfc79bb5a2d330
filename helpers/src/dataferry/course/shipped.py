"""The course's data that ships inside the package: manifests of the public data sets the lessons read
(and the offline lab mirrors), and the runs from real clouds that the analysis lesson pools.

They live in the repository's top-level ``data/`` folder; ``dataferry/course/data`` links to it, so a wheel or a
``pip install`` from git carries them as plain files wherever the package goes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dataferry.errors import BadArgument

__all__ = ["DATA", "public_manifest", "shipped_results"]

#: The shipped data folder.
DATA = Path(__file__).with_name("data")


#: The 2020 post the course revisits ("Large datasets on Colab", 18 September 2020) and the sentences
#: the lessons quote from it, word for word; lessons print them with :func:`post_quote`, never paraphrase
#: a number of it.
POST_2020: dict[str, Any] = {
    "title": "Large datasets on Colab",
    "url": "https://sharkovsky.github.io/2020/09/18/colab-io-bench.html",
    "quotes": {
        "caching": "after the first epoch of training, caching the files locally on the Colab runtime significantly "
                   "improves the performance, to the point that other factors (such as gpu transfers) may become the "
                   "bottlenecks to training performance",
        "bottleneck": "the major bottleneck for the performance of reading the training dataset is the time "
                      "required to transfer the files from their remote location to the Colab environment during "
                      "the first epoch",
        "region": "geographic location plays an important role in affecting the performance, while choosing a "
                  "cpu, gpu or tpu runtime does not",
        "region_boost": "a 2x-10x boost",
        "first_read": "during the first read, all bandwidths are the same",
        "second_read": "more than 1000x faster for GDrive and the Manual approach",
        "gcsfuse": "GCSFuse does not seem to aggressively exploit the read-only nature of ML workflows, meaning "
                   "that subsequent reads after the first are almost as slow as the first one",
        "upload": "it can take up to 6 hours to upload a <2 GB dataset to the Colab environment",
        "proximity": "geographic proximity can give a 2x-10x boost to performance",
        "eviction": "we did our best to ensure that file contents were not kept in memory between the first and "
                    "second reads",
        "gdrive_checks": "it might be possible that GDrive is performing some checks or contacting the remote server",
        "zip_on_drive": "An efficient approach to uploading large datasets to Drive is to upload a zipped folder, and "
                        "unzip it directly on the Drive",
        "manual_best": "The GCS Manual approach offers the best performance",
    },
}


def post_quote(key: str) -> str:
    """One sentence of the 2020 post, in quotation marks, exactly as it wrote it (keys: ``POST_2020["quotes"]``)."""
    return f"\u201c{POST_2020['quotes'][key]}\u201d"


def public_manifest(name: str) -> dict[str, Any]:
    """What the course knows of a public data set (``flowers``, ``landsat-scene``): bucket, prefix, suffix,
    where Google documents it, and the counts or sizes the lab's stand-in reproduces. A new dict each call,
    so a caller that changes it changes no one else's."""
    path = DATA / "public" / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (DATA / "public").glob("*.json"))
        raise BadArgument(f"no manifest for the public data set {name!r}; known: {', '.join(known) or 'none'}")
    return json.loads(path.read_text())


def shipped_results() -> Path:
    """The runs from real clouds that ship with the course, one folder each (contributed through lesson 07)."""
    return DATA / "results"
