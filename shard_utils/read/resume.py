"""Resumable input without TensorFlow: one input pipeline's share of a global step, read through the index, and a
Grain dataset of those shares whose iterator state is the global step (so it restores on any process count).

    import grain
    from shard_utils.random_access import Decoder, RandomAccessSource
    from shard_utils.resume import grain_dataset

    src = RandomAccessSource("gs://bucket/ds", "train")
    ds = grain_dataset(src, seed=0, global_batch_size=1024, process_index=jax.process_index(),
                       process_count=jax.process_count(), decode=Decoder.for_source(src))
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=16)))   # it.get_state() == {"next_index": step}

Element k of the dataset is this process's part of global step k (`shard_utils.epochs` decides which records),
so Grain's own iterator state, `{"next_index": k}`, means the same step on every process: a state saved by a
run on P processes is restored by `it.set_state(state)` on P' processes, with the global batch unchanged.
The source may also be Grain's `ArrayRecordDataSource(manifest.array_record_paths(split))`: it holds the same
records in the same order, so the same seed gives the same steps.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shard_utils.read import epochs

__all__ = ["ShareReader", "grain_dataset", "stream_origin"]

ENDLESS = 2**62  # global steps: training input repeats forever


def stream_origin(start_step: int | None, start_example: int | None) -> tuple[int, int]:
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
    """One input pipeline's share of a global step: its serialized records, read with one batched, coalesced
    `_getitems` of a RandomAccessSource (CRCs checked), or `__getitems__` of an ArrayRecordDataSource, and their
    augmentation seeds.

    Picklable and stateless (the source opens files per read), so any thread or worker process can call it.
    """

    def __init__(self, source, seed: int, share: epochs.Share, origin: int = 0):
        self.source, self.seed, self.share, self.origin = source, int(seed), share, int(origin)

    def rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, epochs) this pipeline reads at global step `step`, in stream order."""
        return epochs.stream_rows(self.seed, len(self.source), self.share.positions(int(step), self.origin))

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        rows, eps = self.rows(step)
        records = np.empty(len(rows), dtype=object)
        read = getattr(self.source, "_getitems", None) or self.source.__getitems__
        records[:] = read(rows.tolist())
        return records, epochs.record_seeds(self.seed, eps, rows)


class _DecodedShare:
    """Grain map function: global step -> this process's share, each record decoded, stacked into one batch."""

    def __init__(self, reader: ShareReader, decode: Callable[[bytes], Any] | None):
        self.reader, self.decode = reader, decode

    def __call__(self, step: int) -> Any:
        records, _ = self.reader(step)
        if self.decode is None:
            return records
        return _stack([self.decode(r) for r in records])


def _stack(items: list[Any]) -> Any:
    """Decoded records as one batch: dicts key by key, arrays along a new first axis."""
    if isinstance(items[0], dict):
        return {k: np.stack([np.asarray(item[k]) for item in items]) for k in items[0]}
    return np.stack([np.asarray(item) for item in items])


def grain_dataset(source, *, seed: int, global_batch_size: int, process_index: int = 0, process_count: int = 1,
                  decode: Callable[[bytes], Any] | None = None):
    """A `grain.MapDataset` whose element k is this process's `global_batch_size / process_count` records of
    global step k: serialized records, or with `decode` (e.g. `Decoder.for_source(source)`) a stacked batch."""
    try:
        import grain
    except ImportError:
        raise ImportError("grain_dataset needs Grain: pip install grain") from None
    if len(source) < global_batch_size:
        raise ValueError(f"split {getattr(source, 'split', '')!r} has {len(source)} records, fewer than one global "
                         f"batch of {global_batch_size}; use a smaller batch size")
    reader = ShareReader(source, seed, epochs.share(global_batch_size, process_count, process_index))
    return grain.MapDataset.range(ENDLESS).map(_DecodedShare(reader, decode))
