"""The loader's resumable training input: this pipeline's share of every global step, read through the index.

`make_dataset(..., seed=S, start_step=K)` comes here. Which records make up a global step is `shard_utils.epochs`'
pure function of (seed, stream position); this module only reads them. Each step's share is one call that
computes its rows and reads them with `RandomAccessSource` (ranged reads by offset and length, both TFRecord
CRCs checked, adjacent records coalesced), so records before the start are never read, and a resume at 90 % of an
epoch starts as fast as a fresh run. Steps are read in parallel but yielded in order (deterministic tf.data), so
batch membership never depends on thread timing.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from shard_utils.read import epochs
from shard_utils.format.manifest import Manifest

_ENDLESS = 2**62  # steps: training repeats forever, like the shuffled pipeline


def stream_origin(start_step: int | None, start_example: int | None, global_batch_size: int) -> tuple[int, int]:
    """(origin, first step): the stream position of step 0 and the first step to read; ValueError if malformed.

    `start_step=K` resumes a run whose global batch never changed (step K begins at K x global batch);
    `start_example=E` resumes after a change of global batch: the first step begins at example E exactly.
    """
    if start_step is not None and start_example is not None:
        raise ValueError("give start_step (a run whose global batch never changed) or start_example (the examples "
                         "consumed, after a change of global batch), not both")
    value, name = (start_step, "start_step") if start_step is not None else (start_example, "start_example")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return (0, int(value)) if name == "start_step" else (int(value), 0)


class ShareReader:
    """One input pipeline's share of a global step: its serialized records and their augmentation seeds.

    Picklable and stateless (the source opens files per read), so any thread or process can call it.
    """

    def __init__(self, source, seed: int, share: epochs.Share, origin: int = 0):
        self.source, self.seed, self.share, self.origin = source, int(seed), share, int(origin)

    def rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, epochs) this pipeline reads at global step `step`, in stream order."""
        return epochs.stream_rows(self.seed, len(self.source), self.share.positions(int(step), self.origin))

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        rows, eps = self.rows(step)
        records = np.empty(len(rows), dtype=object)
        records[:] = self.source._getitems(rows.tolist())
        return records, epochs.record_seeds(self.seed, eps, rows)


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

    steps = tf.data.Dataset.range(first_step, _ENDLESS)
    records = steps.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    return records.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))  # as repeat() says
