"""The loader's resumable training input: this pipeline's share of every global step, read through the index.

`make_dataset(..., seed=S, start_step=K)` comes here. Which records make up a global step is `shard_utils.epochs`'
pure function of (seed, stream position); this module only reads them. Each step's share is one call that
computes its rows and reads them with `RandomAccessSource` (ranged reads by offset and length, both TFRecord
CRCs checked, adjacent records coalesced), so records before the start are never read, and a resume at 90 % of an
epoch starts as fast as a fresh run. Steps are read in parallel but yielded in order (deterministic tf.data), so
batch membership never depends on thread timing.
"""
from __future__ import annotations

import tensorflow as tf

from shard_utils.format.manifest import Manifest
from shard_utils.read import epochs
from shard_utils.read.resume import ENDLESS, ShareReader

__all__ = ["training_records"]


def training_records(m: Manifest, split: str, *, seed: int, share: epochs.Share, origin: int,
                     first_step: int) -> tf.data.Dataset:
    """(serialized record, int64 [2] seeds) of this pipeline from global step `first_step` on, in order, forever."""
    from shard_utils.read.random_access import RandomAccessSource  # needs google-crc32c and fastavro: named if missing

    source = RandomAccessSource(m, split)
    if len(source) < share.global_batch_size:
        raise ValueError(f"split {split!r} has {len(source)} records, fewer than one global batch of "
                         f"{share.global_batch_size}; use a smaller batch size")
    reader = ShareReader(source, seed, share, origin)

    def read(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        records, seeds = tf.numpy_function(reader, [step], [tf.string, tf.int64], stateful=False)
        return tf.ensure_shape(records, [share.size]), tf.ensure_shape(seeds, [share.size, 2])

    steps = tf.data.Dataset.range(first_step, ENDLESS)
    records = steps.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    return records.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))  # as repeat() says
