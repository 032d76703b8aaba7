"""Generations: a dataset grown by appends, without rewriting or renaming anything already published.

Generation 0 is the first build; each `tpu-shards build --append` adds generation g = 1, 2, ... Pure
functions: names, the label order, where a generation's shards go so hosts stay balanced, and the
manifest and index of the grown dataset.

Names. Generation g of split `train` is stored exactly like a split named `train-g00g`:

    train-00000-of-00008.tfrecord          generation 0 (unchanged by appends)
    train-g001-00000-of-00008.tfrecord     generation 1
    train.g001.index.avro                  the split's index, every generation, as of generation 1
    rejected.g001.jsonl                    every rejected file of generations 0..1

so a glob `train*.tfrec*` still finds the whole split in one folder, TFDS reads generation g as its own
split `train-g00g` (one filepathTemplate per TFDS split), and a shard's file never changes once written.
The index and the report files covering all generations get a new name per generation because the previous
manifest names the old ones, which must stay as they are until the new manifest replaces it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO

from shard_utils import storage
from shard_utils.format.labels import label_order  # noqa: F401 - an append's label ids, beside its other rules
from shard_utils.format.manifest import Generation, Manifest

__all__ = [
    "label_order", "host_offset", "position", "generations_of", "next_generation", "DigestingReader", "merged_counts",
    "merged_features"
]


def host_offset(shard_records: Sequence[int], unit: int) -> int:
    """Where a new generation's larger shards should start so that hosts stay within one record of each other.

    A host (pipeline i of n, n dividing `unit` = cores x hosts) reads the shards at positions p with p % n == i.
    Within a generation the first r shards hold one record more; placing a generation's shard k at position
    (k + offset) % S deals those extra records round-robin after the previous generations' ones.
    """
    totals = [0] * unit
    for position, n in enumerate(shard_records):
        totals[position % unit] += n
    low, high = min(totals), max(totals)
    if low == high:
        return 0
    starts = [h for h in range(unit) if totals[h] == low and totals[h - 1] == high]
    return starts[0] if starts else totals.index(low)


def position(shard: int, num_shards: int, offset: int) -> int:
    """The place (within its generation) of the planner's shard `shard`."""
    return (shard + offset) % num_shards


def generations_of(m: Manifest) -> list[Generation]:
    """The manifest's generations; a dataset built once is its generation 0."""
    if m.generations:
        return list(m.generations)
    return [Generation(
        generation=0, created=m.created, input=m.input, files_seen=m.files_seen,
        num_records={name: s.num_records for name, s in m.splits.items()},
        num_shards={name: len(s.shards) for name, s in m.splits.items()},
        rejected=int(m.rejected.get("count", 0)), skipped=int(m.skipped.get("count", 0)),
        tool_version=m.tool_version)]


def next_generation(m: Manifest) -> int:
    return len(generations_of(m))


class DigestingReader:
    """A readable stream that digests (size, CRC32C, SHA-256) every byte read through it."""

    def __init__(self, stream: IO[bytes], digest: storage.Digest | None = None):
        self._stream = stream
        self.digest = digest if digest is not None else storage.Digest()

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.digest.update(data)
        return data

    def tell(self) -> int:
        return self._stream.tell()


def merged_counts(old: Mapping[str, int], new: Mapping[str, int], labels: Sequence[str]) -> dict[str, int]:
    """Class counts by label name over both, in label-id order."""
    return {name: old.get(name, 0) + new.get(name, 0) for name in labels}


def merged_features(old: Mapping[str, dict], new: Mapping[str, dict]) -> dict[str, dict]:
    """The old feature table with each list's max_length grown to the new records'; ValueError when the new
    records have other features or shapes (they were built with other options)."""
    if set(old) != set(new):
        raise ValueError(f"the new records have features {sorted(set(new) ^ set(old))} that differ from the dataset's")
    out = {}
    for key, spec in old.items():
        other = new[key]
        if (spec.get("dtype"), spec.get("shape")) != (other.get("dtype"), other.get("shape")):
            raise ValueError(f"feature {key!r} is {other.get('dtype')} {other.get('shape')} in the new records and "
                             f"{spec.get('dtype')} {spec.get('shape')} in the dataset")
        out[key] = dict(spec)
        if "max_length" in spec:
            out[key]["max_length"] = max(int(spec["max_length"]), int(other.get("max_length", 0)))
    return out
