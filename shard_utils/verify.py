"""Public import path of `shard_utils.read.verify`."""
from shard_utils.read.verify import (
    CHEAP_CHECK_THREADS,
    IN_MEMORY_SHARD_BYTES,
    MAX_INDEX_PROBLEMS,
    check_array_record_shard,
    check_cheap,
    check_croissant,
    check_index,
    check_indexes,
    check_quality,
    check_record,
    check_reports,
    check_shard,
    check_unindexed_shard,
    verify,
)

__all__ = [
    "verify", "CHEAP_CHECK_THREADS", "check_cheap", "check_reports", "check_quality", "check_croissant",
    "IN_MEMORY_SHARD_BYTES", "check_shard", "check_unindexed_shard", "check_array_record_shard", "check_record",
    "MAX_INDEX_PROBLEMS",
    "check_indexes", "check_index"
]
