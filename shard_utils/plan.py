"""Shard planning: how many shards a split gets and which records go in each.

Pure functions over plain numbers, so the balance guarantees are tested without a
pipeline. Records are ordered by a seeded hash of their key (`sort_key`); shard i
of S holds a contiguous run of that order, and run lengths differ by at most one.
"""
from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

SHARD_EXTENSIONS = ("tfrecord", "tfrec")  # tfrec: what Kaggle's TPU notebooks glob for
SHARD_NAME = "{split}-{index:05d}-of-{count:05d}.{extension}"
SHARD_PATTERN = r"^(?P<split>[A-Za-z0-9_.-]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.(?P<extension>tfrecord|tfrec)$"
MB = 1_000_000


class PlanError(ValueError):
    """A split cannot be sharded as asked (too few records for the cores, bad --num-shards...)."""


def shard_name(split: str, index: int, count: int, extension: str = "tfrecord") -> str:
    """The file name of shard `index` of `count` in `split`."""
    return SHARD_NAME.format(split=split, index=index, count=count, extension=extension)


def sort_key(seed: int, key: str) -> int:
    """A 64-bit seeded hash of a record key: the global shuffle order."""
    return int.from_bytes(hashlib.sha256(f"order:{seed}:{key}".encode("utf-8")).digest()[:8], "big")


def unit_hash(seed: int, key: str) -> float:
    """A seeded hash of a key mapped to [0, 1): used to assign splits by fraction."""
    digest = hashlib.sha256(f"split:{seed}:{key}".encode("utf-8")).digest()[:8]
    return int.from_bytes(digest, "big") / 2**64


def choose_split(fractions: list[tuple[str, float]], seed: int, key: str) -> str:
    """The split whose cumulative fraction range holds the key's hash."""
    u = unit_hash(seed, key)
    total = sum(f for _, f in fractions)
    acc = 0.0
    for name, frac in fractions:
        acc += frac / total
        if u < acc:
            return name
    return fractions[-1][0]


def num_shards(num_records: int, num_bytes: int, *, num_cores: int = 8, num_hosts: int = 1,
               target_shard_bytes: int = 128 * MB, forced: int | None = None, split: str = "") -> int:
    """Shard count for one split: a multiple of cores x hosts near the target size, never an empty shard."""
    unit = num_cores * num_hosts
    where = f"split {split!r}: " if split else ""
    if forced is not None:
        if forced <= 0 or forced % unit:
            raise PlanError(f"{where}--num-shards {forced} is not a positive multiple of num_cores x num_hosts = {unit}")
        if forced > num_records:
            raise PlanError(f"{where}--num-shards {forced} is more than its {num_records} records; shards would be empty")
        return forced
    if num_records < unit:
        raise PlanError(
            f"{where}{num_records} records cannot fill {unit} shards (num_cores x num_hosts) without empty ones; "
            f"add images, lower --num-cores/--num-hosts, or change --splits")
    ideal = num_bytes / max(1, target_shard_bytes)
    count = max(1, round(ideal / unit)) * unit
    return min(count, (num_records // unit) * unit)


def shard_sizes(num_records: int, count: int) -> list[int]:
    """Record count of each shard: the first n % S shards hold one more."""
    q, r = divmod(num_records, count)
    return [q + 1 if i < r else q for i in range(count)]


def shard_starts(num_records: int, count: int) -> list[int]:
    """The rank at which each shard starts."""
    starts, acc = [], 0
    for size in shard_sizes(num_records, count):
        starts.append(acc)
        acc += size
    return starts


def shard_of_rank(rank: int, starts: list[int]) -> int:
    """The shard holding the record of a given rank."""
    return bisect.bisect_right(starts, rank) - 1


def num_buckets(num_records: int, per_bucket: int = 10_000) -> int:
    """How many hash buckets rank assignment uses, so one group holds about `per_bucket` keys."""
    return max(1, -(-num_records // per_bucket))


def bucket_of(key_hash: int, buckets: int) -> int:
    """The bucket of a 64-bit sort key; buckets are contiguous, ordered ranges of the hash."""
    return (key_hash * buckets) >> 64


def bucket_offsets(counts: dict[int, int], buckets: int) -> list[int]:
    """Rank of the first record of each bucket, from per-bucket counts."""
    offsets, acc = [], 0
    for b in range(buckets):
        offsets.append(acc)
        acc += counts.get(b, 0)
    return offsets


@dataclass(frozen=True)
class SplitPlan:
    """The plan for one split: its record count and shard boundaries."""

    split: str
    num_records: int
    num_bytes: int
    num_shards: int
    buckets: int

    @property
    def starts(self) -> list[int]:
        return shard_starts(self.num_records, self.num_shards)


def plan_split(split: str, num_records: int, num_bytes: int, *, num_cores: int, num_hosts: int,
               target_shard_bytes: int, forced: int | None = None) -> SplitPlan:
    """Plan one split from its totals."""
    count = num_shards(num_records, num_bytes, num_cores=num_cores, num_hosts=num_hosts,
                       target_shard_bytes=target_shard_bytes, forced=forced, split=split)
    return SplitPlan(split, num_records, num_bytes, count, num_buckets(num_records))
