"""Grain's `ArrayRecordDataSource` over a dataset's ArrayRecord shards, local or in a bucket, read where they are.

array-record reads `gs://` objects itself (google-cloud-cpp inside its reader, with Application Default
Credentials): opening a shard is one ranged GET of its last 1 MiB (footer and index, for shards of fewer than
about 90,000 records), and each record read is one ranged GET; nothing is downloaded first. Grain, given bare
paths, opens every shard once when the source is made, only to count its records; here the counts come from the
manifest, so making a source reads nothing and each shard is opened on its first read.

    m = load("gs://bucket/ds")
    ds = (grain.MapDataset.source(array_record_source(m, "train")).seed(0).shuffle()
          .map(Decoder.for_manifest(m)).batch(256))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shard_utils import storage
from shard_utils.extras import require
from shard_utils.format.manifest import Manifest, load

__all__ = ["ShardSlice", "shard_slices", "array_record_source"]


@dataclass(frozen=True)
class ShardSlice:
    """Records skip .. skip + take - 1 of one ArrayRecord shard: Grain's and TFDS's `FileInstruction`."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


def shard_slices(m: Manifest, split: str | Sequence[str]) -> list[ShardSlice]:
    """The ArrayRecord shard pieces a split or split expression reads, in its reading order, with their counts from
    the manifest; ManifestError when a split it names has no ArrayRecord shards."""
    shards = {}
    out = []
    for piece in m.select(split).pieces:
        if piece.split not in shards:
            shards[piece.split] = m.array_record_shards(piece.split)
        shard = shards[piece.split][piece.shard]
        out.append(ShardSlice(storage.join(m.location, shard.path), piece.start, piece.num_records, shard.num_records))
    return out


def array_record_source(dataset: str | Manifest, split: str | Sequence[str], *,
                        reader_options: Mapping[str, str] | None = None) -> Any:
    """`grain.sources.ArrayRecordDataSource` of a split (or split expression: 'train[:80%]+validation') of a dataset
    built with --format array_record or both, local or gs://; position i is the i-th record in reading order, the
    same bytes as `RandomAccessSource(dataset, split)[i]`. Making it reads no shard."""
    grain = require("grain", "grain", "reading ArrayRecord shards with Grain")
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    options = dict(reader_options) if reader_options is not None else None
    return grain.sources.ArrayRecordDataSource(shard_slices(m, split), options)
