"""Band buckets moved as numpy arrays, a partition at a time: how the distributed clustering
(beam_jobs.pipeline.near_dups) shuffles signatures (pure functions).

The graph's nodes are distinct signatures, not records: records of one signature always end in one cluster, so
a record only joins its signature's component at the end. A worker buffers signatures (at most `MAX_BUFFER`)
and cuts them, all bands at once, into partitions: partition p holds band `p >> PARTITION_BITS`'s buckets whose
16-bit value starts with the bits `p & (2**PARTITION_BITS - 1)`, so every bucket lies whole in one partition.
What one buffer puts in one partition is one element: its distinct signatures as uint64 bytes (8 bytes a
signature and band, where a band key as its own element carried the record's fields), and in band 0's
partitions the signatures that occurred more than once in the buffer. A partition's reducer recomputes its
band's values, cuts them into buckets and verifies those of two or more distinct signatures
(`clusters.verified_edges`, hot buckets in blocks); band 0's reducers also name the signatures more than one
record has (a node standing alone: a cluster of equal signatures), counting every signature once per band
whatever number of records share it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from shard_utils.quality.clusters import BAND_BITS, MAX_BUCKET, Banding, verified_edges

__all__ = ["MAX_BUFFER", "PARTITION_BITS", "Part", "PartitionBuffer", "PartitionOutcome", "cut", "partition_count",
           "reduce_partition", "signed"]

PARTITION_BITS = 2  # each band's buckets in 4 partitions: 272 at 68 bands (docs/near-duplicates.md)
MAX_BUFFER = 10_000  # signatures a worker holds before cutting them (band values: 68 x 8 bytes each at the peak)

Part = tuple[int, tuple[bytes, bytes]]  # (partition, (distinct signatures, those repeated in the buffer: uint64))


def partition_count(banding: Banding, bits: int = PARTITION_BITS) -> int:
    return banding.bands << bits


def signed(signatures: np.ndarray) -> list[int]:
    """uint64 signatures as Python ints in int64's range, which Beam's coder writes natively (a node's name)."""
    return np.asarray(signatures, dtype=np.uint64).view(np.int64).tolist()


def cut(banding: Banding, signatures: np.ndarray, bits: int = PARTITION_BITS) -> list[Part]:
    """Buffered signatures (uint64, repeats allowed) cut into their partitions, in partition order: only those
    that some signature falls in. The same signatures give the same parts (a retried bundle re-sends them)."""
    distinct, counts = np.unique(np.asarray(signatures, dtype=np.uint64), return_counts=True)
    if not len(distinct):
        return []
    repeated = distinct[counts > 1]
    values = banding.band_values(distinct)
    shift = np.uint16(BAND_BITS - bits)
    parts: list[Part] = []
    for band in range(banding.bands):
        top = values[:, band] >> shift
        order = np.argsort(top, kind="stable")  # distinct is sorted: so is each partition's slice
        sizes = np.bincount(top, minlength=1 << bits)
        ends = np.cumsum(sizes)
        for high in np.flatnonzero(sizes).tolist():
            sigs = distinct[order[ends[high] - sizes[high]:ends[high]]]
            again = np.intersect1d(sigs, repeated, assume_unique=True) if band == 0 and len(repeated) else sigs[:0]
            parts.append(((band << bits) | high, (sigs.tobytes(), again.tobytes())))
    return parts


class PartitionBuffer:
    """Signatures (8 big-endian bytes each) held until `limit` of them or the bundle's end, then cut into parts:
    a worker's memory stays bounded whatever its bundle's size."""

    def __init__(self, banding: Banding, limit: int = MAX_BUFFER, bits: int = PARTITION_BITS):
        if limit < 1:
            raise ValueError(f"a partition buffer holds at least 1 signature, not {limit}")
        self.banding, self.limit, self.bits = banding, limit, bits
        self.held: list[bytes] = []

    def add(self, signature: bytes) -> list[Part]:
        """The parts of the buffer when this signature fills it, else none (it is held)."""
        self.held.append(signature)
        return self.flush() if len(self.held) >= self.limit else []

    def flush(self) -> list[Part]:
        """The held signatures' parts; the buffer is empty after."""
        if not self.held:
            return []
        sigs = np.frombuffer(b"".join(self.held), dtype=">u8").astype(np.uint64)
        self.held = []
        return cut(self.banding, sigs, self.bits)


@dataclass
class PartitionOutcome:
    """A partition's near pairs, as spanning-forest edges between signatures (int64 view: `signed`), each
    signature more than one record has as an edge to itself, and the buckets it verified."""

    edges: list[tuple[int, int]] = field(default_factory=list)
    buckets_verified: int = 0
    hot_buckets: int = 0


def reduce_partition(banding: Banding, partition: int, parts: Iterable[tuple[bytes, bytes]], cap: int = MAX_BUCKET,
                     bits: int = PARTITION_BITS) -> PartitionOutcome:
    """The edges of one partition's buckets, from every part sent to it (any order, any number of buffers)."""
    chunks, again = [], []
    for sigs, repeated in parts:
        chunks.append(np.frombuffer(sigs, dtype=np.uint64))
        again.append(np.frombuffer(repeated, dtype=np.uint64))
    out = PartitionOutcome()
    if not chunks:
        return out
    band = partition >> bits
    distinct, counts = np.unique(np.concatenate(chunks), return_counts=True)
    if band == 0:  # equal signatures: named once, from one band, whatever number of records share them
        alone = np.union1d(distinct[counts > 1], np.concatenate(again))
        out.edges += [(s, s) for s in signed(alone)]
    if len(distinct) < 2:
        return out
    values = banding.band_values(distinct, slice(band, band + 1))[:, 0]
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, len(ordered)])
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
        members = distinct[order[start:start + size]].tolist()
        outcome = verified_edges(((s, s) for s in members), banding.threshold, cap)
        out.buckets_verified += 1
        out.hot_buckets += outcome.blocks > 1
        if outcome.edges:
            pairs = np.array(outcome.edges, dtype=np.uint64).reshape(-1, 2)
            out.edges += [(a, b) for a, b in signed(pairs)]
    return out
