"""Deterministic epochs: which records make up every global batch, as pure functions of integers (numpy only).

Training reads one endless *stream* of a split's records: epoch 0's order, then epoch 1's, and so on, each a
seeded permutation of the split's rows (its index order). Global step `k` of a run with global batch `G` is
stream positions `k*G .. k*G+G-1`, so a batch may straddle two epochs and no record is ever dropped: every epoch
is seen exactly once, whatever `G`. Input pipeline `p` of `P` takes the p-th `G/P` of every global batch.

So the whole state of an input pipeline is the seed and the number of examples the run has consumed (`step * G`
while `G` is fixed); it does not depend on the number of hosts, replicas or threads, and restores on any count.

The permutation is a keyed (unbalanced) Feistel network on the smallest power of two covering the split, walked
back into range (as Grain's and TensorFlow's `index_shuffle` do): each position maps to its row in O(1), with no
per-epoch table, so a resume at any position costs the same as a start. Everything is plain uint64 arithmetic
written here, so the order never changes with a numpy or TensorFlow upgrade.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["Share", "batch_rows", "epoch_order", "permute", "record_seeds", "share", "stream_rows"]

_ROUNDS = 8  # half-rounds
_U64 = np.uint64
_MASK64 = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijective, well-avalanched 64-bit mix (wrapping uint64 arithmetic)."""
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _key(*parts: int) -> np.ndarray:
    """One 64-bit key from integers (any sign or size, taken modulo 2**64), as a 1-element uint64 array."""
    key = np.zeros(1, dtype=_U64)
    for part in parts:
        key = _mix(key ^ np.array([int(part) & _MASK64], dtype=_U64))
    return key


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, epoch: int) -> tuple[np.uint64, ...]:
    """The Feistel round keys of one (seed, epoch), computed once."""
    return tuple(_key(seed, epoch, r)[0] for r in range(_ROUNDS))


def _check_count(num_records: int) -> None:
    if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)) or num_records < 1:
        raise ValueError(f"num_records must be a positive int, got {num_records!r}")


def permute(seed: int, epoch: int, num_records: int, positions: np.ndarray) -> np.ndarray:
    """The rows at `positions` (0 .. num_records-1) of epoch `epoch`'s order: a bijection, fixed by (seed, epoch)."""
    _check_count(num_records)
    x = np.asarray(positions, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= num_records):
        raise ValueError(f"positions must lie in 0..{num_records - 1}")
    bits = max(2, int(num_records - 1).bit_length())
    high, low = bits // 2, bits - bits // 2  # the value is (left: high bits, right: low bits)
    mask_left, mask_right = _U64((1 << high) - 1), _U64((1 << low) - 1)
    keys = _round_keys(int(seed), int(epoch))
    out = x.astype(_U64)
    todo = np.arange(out.size)
    while todo.size:  # cycle walking: a value outside the split is permuted again until it lands inside
        v = out[todo]
        left, right = v >> _U64(low), v & mask_right
        for r, key in enumerate(keys):  # each half-round xors one side with a keyed mix of the other: invertible
            if r % 2:
                right = right ^ (_mix(left ^ key) & mask_right)
            else:
                left = left ^ (_mix(right ^ key) & mask_left)
        out[todo] = (left << _U64(low)) | right
        todo = todo[out[todo] >= _U64(num_records)]
    return out.astype(np.int64)


def epoch_order(seed: int, epoch: int, num_records: int) -> np.ndarray:
    """Every row of the split in epoch `epoch`'s order (for tests and tools: loaders map positions directly)."""
    return permute(seed, epoch, num_records, np.arange(num_records))


def stream_rows(seed: int, num_records: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, epochs) at these positions of the endless stream: position q is row permute(q % n) of epoch q // n."""
    _check_count(num_records)
    q = np.asarray(positions, dtype=np.int64)
    if q.size and q.min() < 0:
        raise ValueError("stream positions must be >= 0")
    epochs, within = np.divmod(q, num_records)
    if q.size and epochs.min() == epochs.max():  # one epoch: the usual case
        return permute(seed, int(epochs[0]), num_records, within), epochs
    rows = np.empty_like(q)
    for epoch in np.unique(epochs):
        here = epochs == epoch
        rows[here] = permute(seed, int(epoch), num_records, within[here])
    return rows, epochs


@dataclass(frozen=True)
class Share:
    """Input pipeline `pipeline`'s part of every global batch: `size` records from `offset` within the batch."""

    pipeline: int
    num_pipelines: int
    offset: int
    size: int
    global_batch_size: int

    def positions(self, step: int, origin: int = 0) -> np.ndarray:
        """The stream positions this pipeline reads at global step `step` of a run whose step 0 is at `origin`."""
        first = int(origin) + int(step) * self.global_batch_size + self.offset
        return np.arange(first, first + self.size, dtype=np.int64)


def share(global_batch_size: int, num_pipelines: int = 1, pipeline: int = 0) -> Share:
    """The p-th of P equal, consecutive parts of every global batch; ValueError if P does not divide it."""
    for name, value in (("global_batch_size", global_batch_size), ("num_pipelines", num_pipelines)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not 0 <= pipeline < num_pipelines:
        raise ValueError(f"pipeline {pipeline} is not one of 0..{num_pipelines - 1}")
    if global_batch_size % num_pipelines:
        raise ValueError(f"the global batch of {global_batch_size} does not split evenly over {num_pipelines} input "
                         "pipelines; use a global batch that is a multiple of the pipeline count")
    size = global_batch_size // num_pipelines
    return Share(int(pipeline), int(num_pipelines), int(pipeline) * size, size, int(global_batch_size))


def batch_rows(seed: int, num_records: int, global_batch_size: int, step: int, origin: int = 0) -> np.ndarray:
    """The rows of global step `step` (all pipelines together), in stream order."""
    rows, _ = stream_rows(seed, num_records, share(global_batch_size).positions(step, origin))
    return rows


def record_seeds(seed: int, epochs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64 [k, 2] stateless-op seeds of each (epoch, row): the same augmentation on any resume or host count."""
    epochs, rows = np.asarray(epochs, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    base = np.array([int(_key(seed, -1)[0]) & ((1 << 63) - 1)], dtype=np.int64)
    return np.stack([np.broadcast_to(base, epochs.shape) ^ epochs, rows], axis=-1)
