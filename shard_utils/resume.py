"""Public import path of `shard_utils.read.resume`."""
from shard_utils.read.resume import (
    ShareReader,
    grain_dataset,
    stream_origin,
)

__all__ = ["ShareReader", "grain_dataset", "stream_origin"]
