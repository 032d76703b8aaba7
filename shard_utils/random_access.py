"""Public import path of `shard_utils.read.random_access`."""
from shard_utils.read.random_access import (
    COALESCE_MAX_BYTES,
    Decoder,
    RandomAccessSource,
    RecordReadError,
    SplitIndex,
    array_record_source,
    host_slice,
    load_index,
    load_indexes,
    sources,
)

__all__ = [
    "array_record_source", "COALESCE_MAX_BYTES", "RecordReadError", "SplitIndex", "load_index", "load_indexes",
    "sources", "RandomAccessSource", "host_slice", "Decoder"
]
