"""The records each tool wrote, counted from its output files (no tool imported), so that a run whose output is not
complete is never timed as done."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

from shard_utils.format.tfrecord import count_from_headers


def tfrecord_records(out: Path) -> int:
    """Records in every TFRecord file under out (tpu-shards' shards, TFDS's), counted from their framing."""
    total = 0
    for path in out.rglob("*.tfrecord*"):
        with open(path, "rb") as f:
            total += count_from_headers(f, path.stat().st_size)
    return total


def webdataset_records(out: Path) -> int:
    """Samples in the tar shards: members holding an image (`<key>.jpg`)."""
    total = 0
    for path in out.glob("*.tar"):
        with tarfile.open(path) as tar:
            total += sum(1 for member in tar if member.name.endswith(".jpg"))
    return total


def mds_records(out: Path) -> int:
    """Samples in the merged index.json of MDS shards."""
    index = json.loads((out / "index.json").read_text())
    return sum(shard["samples"] for shard in index["shards"])


def litdata_records(out: Path) -> int:
    """Items in litdata's index.json."""
    index = json.loads((out / "index.json").read_text())
    return sum(chunk["chunk_size"] for chunk in index["chunks"])


COUNTERS = {"tpu-shards": tfrecord_records, "no-checks": tfrecord_records, "webdataset": webdataset_records,
            "tfds": tfrecord_records, "mds": mds_records, "litdata": litdata_records}


def records(tool: str, out: Path) -> int:
    """The records `tool` wrote under out; 0 when its index is missing or unreadable."""
    try:
        return COUNTERS[tool](out)
    except (OSError, ValueError, KeyError, tarfile.TarError):
        return 0
