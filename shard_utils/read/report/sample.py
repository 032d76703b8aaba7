"""What a report reads of a split: up to a bounded number of records, and per shown class the few whose
seeded hash of the source id is smallest (the same seed gives the same sample, locally and from gs://)."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from shard_utils import storage
from shard_utils.format.manifest import Manifest
from shard_utils.read.stored import StoredRecord, iter_shard, label_texts

__all__ = ["PER_CLASS", "MAX_CLASSES", "MAX_RECORDS", "Tile", "SplitSample", "shown_classes", "sample_split"]

PER_CLASS = 8  # tiles per class on a contact sheet
MAX_CLASSES = 24  # classes on a contact sheet; more are chosen by seed
MAX_RECORDS = 5000  # records read per split for the sheet and the size chart


@dataclass(frozen=True)
class Tile:
    """One sampled record as the contact sheet shows it."""

    split: str
    shard: str
    index: int
    source_id: str
    labels: tuple[str, ...]
    jpeg: bytes  # the image, or a clip's first frame
    frames: int  # frames in a clip; 0 for an image


@dataclass
class SplitSample:
    """What was read of one split: tiles per shown class (in seeded order), sizes of every record read,
    and shards that could not be read."""

    split: str
    seed: int
    groups: dict[str, list[Tile]]
    class_counts: dict[str, int]  # records per label (a multi-label record counts under each of its labels)
    num_records: int = 0
    scanned: int = 0
    shards_read: int = 0
    shards_total: int = 0
    sizes: list[tuple[int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _hash(seed: int, *parts: object) -> int:
    text = "\0".join([str(seed), *map(str, parts)]).encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def shown_classes(counts: dict[str, int], labels: Sequence[str], seed: int, limit: int = MAX_CLASSES) -> list[str]:
    """The classes a sheet shows: all present ones in label order, or `limit` of them chosen by seed."""
    present = [x for x in labels if counts.get(x, 0) > 0] + sorted(
        x for x, n in counts.items() if n > 0 and x not in set(labels))
    if len(present) <= limit:
        return present
    chosen = set(sorted(present, key=lambda x: _hash(seed, "class", x))[:limit])
    return [x for x in present if x in chosen]


def sample_split(m: Manifest, split: str, *, seed: int = 0, per_class: int = PER_CLASS,
                 max_classes: int = MAX_CLASSES, max_records: int = MAX_RECORDS) -> SplitSample:
    """Read up to max_records records of a split (shards in seeded order) and keep, per shown class, the
    per_class records whose seeded hash of the source id is smallest: the same seed gives the same sample."""
    info = m.split(split)
    classes = shown_classes(info.class_counts, m.labels, seed, max_classes)
    buckets: dict[str, list] = {c: [] for c in classes}
    sample = SplitSample(split, seed, {}, dict(info.class_counts), info.num_records, shards_total=len(info.shards))
    for shard in sorted(info.shards, key=lambda s: _hash(seed, "shard", s.path)):
        if sample.scanned >= max_records:
            break
        sample.shards_read += 1
        try:
            for record in iter_shard(m, split, shard):
                _take(m, record, buckets, per_class, seed, sample)
                if sample.scanned >= max_records:
                    break
        except storage.StorageError as exc:  # a damaged or vanished shard: said on the sheet and the page
            sample.problems.append(str(exc))
    sample.groups = {c: [t for _, t in sorted(buckets[c], key=lambda e: e[0])[:per_class]] for c in classes}
    return sample


def _take(m: Manifest, record: StoredRecord, buckets: dict[str, list], per_class: int, seed: int,
          sample: SplitSample) -> None:
    sample.scanned += 1
    if record.width and record.height:
        sample.sizes.append((record.width, record.height))
    labels = tuple(label_texts(m, record))
    bucket = buckets.get(labels[0] if labels else "")
    if bucket is None:
        return
    rank = (_hash(seed, record.source_id), record.shard, record.index)  # ties (hostile duplicates): by place
    media = record.media
    bucket.append((rank, Tile(record.split, record.shard, record.index, record.source_id, labels,
                              media[0] if media else b"", len(media) if record.is_video else 0)))
    if len(bucket) >= 4 * per_class:  # keep memory at a few tiles per class, whatever the split's size
        bucket.sort(key=lambda e: e[0])
        del bucket[per_class:]
