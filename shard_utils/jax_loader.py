"""Public import path of `shard_utils.read.jax_loader`."""
from shard_utils.read.jax_loader import (
    DATA_AXIS,
    DECODERS,
    GlobalBatches,
    make_iterator,
)

__all__ = ["DATA_AXIS", "DECODERS", "GlobalBatches", "make_iterator"]
