"""Shard planning: how many shards a split gets and which records go in each.

Pure functions over plain numbers, so the balance guarantees are tested without a
pipeline. Records are ordered by a seeded hash of their key (`format.order.sort_key`); shard i
of S holds a contiguous run of that order, and run lengths differ by at most one.
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from shard_utils.errors import InternalError, PlanError

__all__ = [
    "MB", "BUILD_REMEDY", "RESHARD_REMEDY", "num_shards", "shard_sizes", "shard_starts", "shard_of_rank", "OrderKey",
    "DEFAULT_BUCKET_BITS", "bucket_of", "locate_rank", "locate_ranks", "shard_of_key", "SplitPlan", "SplitTotals",
    "plan_split", "plan_splits"
]

MB = 1_000_000
BUILD_REMEDY = "add images, lower --num-cores/--num-hosts, or change --splits"
RESHARD_REMEDY = "reshard to fewer shards per step: lower --num-cores/--num-hosts"


def num_shards(num_records: int, num_bytes: int, *, num_cores: int = 8, num_hosts: int = 1,
               target_shard_bytes: int = 128 * MB, forced: int | None = None, split: str = "",
               remedy: str = BUILD_REMEDY) -> int:
    """Shard count for one split: a multiple of cores x hosts near the target size, never an empty shard."""
    unit = num_cores * num_hosts
    where = f"split {split!r}: " if split else ""
    if forced is not None:
        if forced <= 0 or forced % unit:
            raise PlanError(f"{where}--num-shards {forced} is not a positive multiple of "
                            f"num_cores x num_hosts = {unit}")
        if forced > num_records:
            raise PlanError(f"{where}--num-shards {forced} is more than its {num_records} records; "
                            "shards would be empty")
        return forced
    if num_records < unit:
        raise PlanError(
            f"{where}{num_records} records cannot fill {unit} shards (num_cores x num_hosts) without empty ones; "
            f"{remedy}")
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


OrderKey = tuple  # (sort_key, source_id): the total order of a split's records; ties on the hash break by key

DEFAULT_BUCKET_BITS = 16  # ranks are found by counting keys in 2**16 ordered hash ranges


def bucket_of(sort_key: int, bits: int) -> int:
    """The hash range (of 2**bits contiguous, ordered ranges) a 64-bit sort key falls in."""
    return sort_key >> (64 - bits) if bits else 0


def locate_rank(rank: int, bucket_counts: Mapping[int, int]) -> tuple[int, int]:
    """(bucket, position within the bucket) of the record with a given rank, from per-bucket counts."""
    return locate_ranks([rank], bucket_counts)[0]


def locate_ranks(ranks: Sequence[int], bucket_counts: Mapping[int, int]) -> list[tuple[int, int]]:
    """`locate_rank` of each rank: the buckets sorted and their counts summed once, each rank found by bisection."""
    buckets = sorted(bucket_counts)
    ends = list(itertools.accumulate(bucket_counts[b] for b in buckets))
    total = ends[-1] if ends else 0
    out = []
    for rank in ranks:
        if not 0 <= rank < total:
            raise PlanError(f"rank {rank} is beyond the {total} records counted")
        at = bisect.bisect_right(ends, rank)
        out.append((buckets[at], rank - (ends[at - 1] if at else 0)))
    return out


def shard_of_key(key: OrderKey, boundaries: Sequence[OrderKey]) -> int:
    """The shard holding a record: boundaries[i] is the first key of shard i + 1."""
    return bisect.bisect_right(boundaries, key)


@dataclass(frozen=True)
class SplitPlan:
    """The plan for one split: its record count, shard count, and where each shard starts.

    `boundary_slots` locate the first record of shards 1..S-1 as (hash bucket, position in the
    bucket's sorted keys); `boundaries` are those records' keys, filled in once the few keys of
    those buckets have been sorted (`with_boundaries`).
    """

    split: str
    num_records: int
    num_bytes: int
    num_shards: int
    bucket_bits: int = DEFAULT_BUCKET_BITS
    boundary_slots: tuple[tuple[int, int], ...] = ()
    boundaries: tuple[OrderKey, ...] | None = None

    @property
    def starts(self) -> list[int]:
        return shard_starts(self.num_records, self.num_shards)

    @property
    def sizes(self) -> list[int]:
        return shard_sizes(self.num_records, self.num_shards)

    def size_of(self, shard: int) -> int:
        """Record count of one shard (without listing every shard's)."""
        q, r = divmod(self.num_records, self.num_shards)
        return q + 1 if shard < r else q

    @cached_property
    def boundary_buckets(self) -> frozenset[int]:
        """The buckets where some shard starts: made once per plan, as every record is tested against it."""
        return frozenset(b for b, _ in self.boundary_slots)

    def __getstate__(self) -> dict:
        """The fields only: the buckets are made again where they are used, not shipped."""
        return {name: value for name, value in self.__dict__.items() if name != "boundary_buckets"}

    def with_boundaries(self, bucket_keys: Mapping[int, Sequence[OrderKey]]) -> SplitPlan:
        """The plan with its boundary keys, given the sorted keys of every boundary bucket."""
        try:
            keys = tuple(tuple(bucket_keys[b][i]) for b, i in self.boundary_slots)
        except (KeyError, IndexError):
            raise InternalError(f"split {self.split!r}: the keys of its boundary buckets are incomplete") from None
        return replace(self, boundaries=keys)

    def shard_of(self, key: OrderKey) -> int:
        if self.boundaries is None:
            raise InternalError(f"split {self.split!r}: shard boundaries are not known yet")
        return shard_of_key(tuple(key), self.boundaries)


@dataclass
class SplitTotals:
    """Records, bytes and records per hash bucket of one split (sparse: buckets that hold records)."""

    num_records: int = 0
    num_bytes: int = 0
    bucket_counts: dict[int, int] = field(default_factory=dict)

    def add(self, sort_key: int, length: int, bits: int) -> None:
        self.num_records += 1
        self.num_bytes += length
        b = bucket_of(sort_key, bits)
        self.bucket_counts[b] = self.bucket_counts.get(b, 0) + 1

    def merge(self, other: SplitTotals) -> None:
        self.num_records += other.num_records
        self.num_bytes += other.num_bytes
        for b, n in other.bucket_counts.items():
            self.bucket_counts[b] = self.bucket_counts.get(b, 0) + n


def plan_split(split: str, totals: SplitTotals, *, num_cores: int, num_hosts: int, target_shard_bytes: int,
               forced: int | None = None, bucket_bits: int = DEFAULT_BUCKET_BITS,
               remedy: str = BUILD_REMEDY) -> SplitPlan:
    """Plan one split from its totals: shard count, and where the first record of every shard sits."""
    count = num_shards(totals.num_records, totals.num_bytes, num_cores=num_cores, num_hosts=num_hosts,
                       target_shard_bytes=target_shard_bytes, forced=forced, split=split, remedy=remedy)
    slots = tuple(locate_ranks(shard_starts(totals.num_records, count)[1:], totals.bucket_counts))
    return SplitPlan(split, totals.num_records, totals.num_bytes, count, bucket_bits, slots)


def plan_splits(totals: Mapping[str, SplitTotals], *, expected_splits: Sequence[str], num_cores: int,
                num_hosts: int, target_shard_bytes: int, forced: int | None = None,
                bucket_bits: int = DEFAULT_BUCKET_BITS, remedy: str = BUILD_REMEDY) -> dict[str, SplitPlan]:
    """Plans for every split that received records; a split named in --splits that got none is a PlanError."""
    found = {name: t for name, t in totals.items() if t.num_records}
    if not found:
        raise PlanError("no input file could be used (0 records)")
    emptied = sorted(name for name, t in totals.items() if not t.num_records)  # its records all dropped or moved
    if emptied:
        raise PlanError(f"split {emptied[0]!r}: every record in it is a duplicate of one kept in another split "
                        "(--dedup); remove the copies or build without --dedup")
    missing = [name for name in expected_splits if name not in found]
    if missing:
        raise PlanError(f"split {missing[0]!r} received no records from --splits; give it a larger fraction or "
                        "add images")
    return {name: plan_split(name, t, num_cores=num_cores, num_hosts=num_hosts,
                             target_shard_bytes=target_shard_bytes, forced=forced, bucket_bits=bucket_bits,
                             remedy=remedy)
            for name, t in sorted(found.items())}
