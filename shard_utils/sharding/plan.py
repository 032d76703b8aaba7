"""Shard arithmetic: how many shards a split gets, how many records each holds, and the hash ranges of keys.

Pure functions over plain numbers, so the balance guarantees are tested without a pipeline. Records are
ordered by a seeded hash of their key (`format.order.sort_key`); shard i of S holds a contiguous range of
that order, and shard sizes differ by at most one. Where each shard starts is found in `run_plan`.
"""
from __future__ import annotations

from shard_utils.errors import PlanError

__all__ = ["MB", "BUILD_REMEDY", "RESHARD_REMEDY", "num_shards", "shard_sizes", "shard_starts", "DEFAULT_BUCKET_BITS",
           "bucket_of"]

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


DEFAULT_BUCKET_BITS = 16  # ranks are found by counting keys in 2**16 ordered hash ranges


def bucket_of(sort_key: int, bits: int) -> int:
    """The hash range (of 2**bits contiguous, ordered ranges) a 64-bit sort key falls in."""
    return sort_key >> (64 - bits) if bits else 0
