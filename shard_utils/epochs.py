"""Public import path of `shard_utils.read.epochs`."""
from shard_utils.read.epochs import (
    Share,
    batch_rows,
    epoch_order,
    permute,
    record_seeds,
    share,
    stream_rows,
)

__all__ = ["Share", "batch_rows", "epoch_order", "permute", "record_seeds", "share", "stream_rows"]
