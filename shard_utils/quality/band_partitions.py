"""Band buckets moved as numpy arrays, a partition at a time: how the distributed clustering
(beam_jobs.pipeline.near_dups) shuffles signatures (pure functions).

The graph's nodes are distinct signatures, not records: records of one signature always end in one cluster, so
a record only joins its signature's component at the end, and no record's fields travel with its band keys. A
worker buffers signatures (at most `MAX_BUFFER`, so its memory is bounded whatever its bundle's size) and cuts
them, all bands at once, into partitions: partition p holds band `p >> PARTITION_BITS`'s buckets whose 16-bit
value starts with the bits `p & (2**PARTITION_BITS - 1)`, so every bucket lies whole in one partition. What one
buffer puts in one partition is one element: its distinct signatures and their band values as arrays (10
bytes a signature), and in band 0's partitions the signatures that occurred more than once in the buffer. A
partition's reducer sorts what it received into buckets and verifies those of two or more distinct signatures
(all buckets of one size up to `SMALL_BUCKET` at once with numpy, larger ones with `clusters.verified_edges`, hot
buckets in blocks) and sends a partition's near pairs as a star per component (`spanning_star`); band 0's reducers also
name the signatures more than one record has (a node standing alone: a cluster of equal signatures), so a
signature shared by thousands of records is one entry per buffer, never a bucket of thousands.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from shard_utils.quality.clusters import BAND_BITS, MAX_BUCKET, Banding, verified_edges

__all__ = ["MAX_BUFFER", "PARTITION_BITS", "Part", "PartitionBuffer", "PartitionOutcome", "SignatureForest", "cut",
           "partition_count", "reduce_partition", "signed"]

PARTITION_BITS = 2  # each band's buckets in 4 partitions: 272 at 68 bands (docs/near-duplicates.md)
MAX_BUFFER = 10_000  # signatures a worker holds before cutting them: about 13 MB at the peak
SMALL_BUCKET = 64  # buckets of at most this many distinct signatures: compared with others of their size at once
PAIRS_AT_ONCE = 1 << 18  # pairs of small buckets compared in one array (a few MB)
EDGES_HELD = 1 << 20  # signature edges a forest holds before folding them into stars (16 MB)

Part = tuple[int, tuple[bytes, bytes, bytes]]  # (partition, (signatures: uint64, their band values: uint16, repeated))


def partition_count(banding: Banding, bits: int = PARTITION_BITS) -> int:
    return banding.bands << bits


def signed(signatures: np.ndarray) -> list:
    """uint64 signatures as Python ints in int64's range, which Beam's coder writes natively (a node's name)."""
    return np.asarray(signatures, dtype=np.uint64).view(np.int64).tolist()


def cut(banding: Banding, signatures: np.ndarray, bits: int = PARTITION_BITS) -> list[Part]:
    """Buffered signatures (uint64, repeats allowed) cut into their partitions, in partition order: only those
    that some signature falls in. A part holds its distinct signatures in (band value, signature) order, their
    values, and in band 0 those repeated in the buffer. The same signatures give the same parts (a retried
    bundle re-sends them)."""
    distinct, counts = np.unique(np.asarray(signatures, dtype=np.uint64), return_counts=True)
    if not len(distinct):
        return []
    repeated = distinct[counts > 1]
    values = banding.band_values(distinct)
    highs = np.arange(1, (1 << bits) + 1) << (BAND_BITS - bits)
    parts: list[Part] = []
    for band in range(banding.bands):
        order = np.argsort(values[:, band], kind="stable")  # distinct is sorted: (value, signature) order
        column, sigs = values[order, band], distinct[order]
        ends = np.searchsorted(column, highs, side="left").tolist()
        start = 0
        for high, end in enumerate(ends):
            if end > start:
                again = (np.intersect1d(sigs[start:end], repeated, assume_unique=True) if band == 0 and len(repeated)
                         else sigs[:0])
                parts.append(((band << bits) | high,
                              (sigs[start:end].tobytes(), column[start:end].tobytes(), again.tobytes())))
            start = end
    return parts


class PartitionBuffer:
    """Signatures held until `limit` of them or the bundle's end, then cut into parts: a worker's memory stays
    bounded whatever its bundle's size, and a batch larger than the room left fills the buffer in slices."""

    def __init__(self, banding: Banding, limit: int = MAX_BUFFER, bits: int = PARTITION_BITS):
        if limit < 1:
            raise ValueError(f"a partition buffer holds at least 1 signature, not {limit}")
        self.banding, self.limit, self.bits = banding, limit, bits
        self.held: list[np.ndarray] = []
        self.count = 0

    def extend(self, signatures: np.ndarray) -> list[Part]:
        """The parts of the buffer each time these signatures (uint64) fill it; what is left is held."""
        parts: list[Part] = []
        start = 0
        while start < len(signatures):
            taken = signatures[start:start + self.limit - self.count]
            self.held.append(taken)
            self.count += len(taken)
            start += len(taken)
            if self.count >= self.limit:
                parts += self.flush()
        return parts

    def flush(self) -> list[Part]:
        """The held signatures' parts; the buffer is empty after."""
        if not self.held:
            return []
        sigs = np.concatenate(self.held)
        self.held, self.count = [], 0
        return cut(self.banding, sigs, self.bits)


def _no_nodes() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class PartitionOutcome:
    """A partition's near pairs, as spanning-forest edges a[i]-b[i] between signatures (int64 view: `signed`),
    each signature more than one record has as an edge to itself, and the buckets it verified."""

    a: np.ndarray = field(default_factory=_no_nodes)
    b: np.ndarray = field(default_factory=_no_nodes)
    buckets_verified: int = 0
    hot_buckets: int = 0

    @property
    def edges(self) -> list[tuple[int, int]]:
        return list(zip(self.a.tolist(), self.b.tolist(), strict=True))


def reduce_partition(banding: Banding, partition: int, parts: Iterable[tuple[bytes, bytes, bytes]],
                     cap: int = MAX_BUCKET, bits: int = PARTITION_BITS) -> PartitionOutcome:
    """The edges of one partition's buckets, from every part sent to it (any order, any number of buffers)."""
    sig_chunks, value_chunks, again = [], [], []
    for raw_sigs, raw_values, raw_repeated in parts:
        sig_chunks.append(np.frombuffer(raw_sigs, dtype=np.uint64))
        value_chunks.append(np.frombuffer(raw_values, dtype=np.uint16))
        again.append(np.frombuffer(raw_repeated, dtype=np.uint64))
    out = PartitionOutcome()
    if not sig_chunks:
        return out
    ends: list[tuple[np.ndarray, np.ndarray]] = []
    sigs, values = sig_chunks[0], value_chunks[0]
    first = np.ones(len(sigs), dtype=bool)
    if len(sig_chunks) > 1:  # one part is already in (value, signature) order, each signature once
        sigs, values = np.concatenate(sig_chunks), np.concatenate(value_chunks)
        order = np.lexsort((sigs, values))
        sigs, values = sigs[order], values[order]
        first = np.r_[True, sigs[1:] != sigs[:-1]]  # a signature's copies are adjacent: it has one value
    if partition >> bits == 0:  # equal signatures: named once, from one band, whatever number of records share them
        alone = np.union1d(sigs[np.flatnonzero(~first)], np.concatenate(again))
        ends.append((alone, alone))
        sigs, values = sigs[first], values[first]
    elif len(sig_chunks) > 1:
        sigs, values = sigs[first], values[first]
    if len(sigs) < 2:
        return _with_edges(out, ends)
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    sizes = np.diff(np.r_[starts, len(values)])
    out.buckets_verified = int((sizes > 1).sum())
    small = min(SMALL_BUCKET, cap)  # a bucket over the cap is compared in blocks, as verified_edges does
    pairs = list(_small_bucket_pairs(sigs, starts, sizes, banding.threshold, small))
    large = sizes > small
    for start, size in zip(starts[large].tolist(), sizes[large].tolist(), strict=True):
        outcome = verified_edges(((s, s) for s in sigs[start:start + size].tolist()), banding.threshold, cap)
        out.hot_buckets += outcome.blocks > 1
        if outcome.edges:
            edges = np.array(outcome.edges, dtype=np.uint64).reshape(-1, 2)
            pairs.append((edges[:, 0], edges[:, 1]))
    if pairs:
        roots, members = spanning_star(np.concatenate([a for a, _ in pairs]), np.concatenate([b for _, b in pairs]))
        ends.append((roots, members))
    return _with_edges(out, ends)


def _with_edges(out: PartitionOutcome, ends: list[tuple[np.ndarray, np.ndarray]]) -> PartitionOutcome:
    """`out` with these edges (uint64 ends) as its int64 arrays."""
    if ends:
        out.a = np.concatenate([a for a, _ in ends]).astype(np.uint64).view(np.int64)
        out.b = np.concatenate([b for _, b in ends]).astype(np.uint64).view(np.int64)
    return out


class SignatureForest:
    """Edges between signature nodes (int64) joined into components with numpy: held as arrays, and folded into
    a star per component (`spanning_star`) once more than `held` are held, so it keeps about one edge per node in
    some cluster however many bands found each pair."""

    def __init__(self, held: int = EDGES_HELD):
        self.held = held
        self.a: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.count = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        self.a.append(a)
        self.b.append(b)
        self.count += len(a)
        if self.count > self.held:
            self.fold()

    def merge(self, other: SignatureForest) -> None:
        for a, b in zip(other.a, other.b, strict=True):
            self.add(a, b)

    def fold(self) -> tuple[np.ndarray, np.ndarray]:
        """The edges held, as (root, member) stars and (node, node) for a node linked only to itself."""
        if not self.a:
            return _no_nodes(), _no_nodes()
        a, b = np.concatenate(self.a), np.concatenate(self.b)
        roots, members = spanning_star(a, b)
        lone = np.setdiff1d(a[a == b], np.concatenate([roots, members]))
        a, b = np.concatenate([roots, lone]), np.concatenate([members, lone])
        self.a, self.b, self.count = [a], [b], len(a)
        return a, b

    def components(self) -> tuple[np.ndarray, np.ndarray]:
        """(every node, sorted; its component's number, numbered in the order of their smallest nodes)."""
        roots, members = self.fold()
        nodes, at = np.unique(np.concatenate([roots, members]), return_inverse=True)
        label = np.arange(len(nodes))
        label[at[len(roots):]] = at[:len(roots)]  # a star's members point at its root (a root is its own)
        return nodes, np.unique(label, return_inverse=True)[1]


def spanning_star(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The components of the graph of edges a[i]-b[i] (uint64 nodes) as (root, member) edges, a star per
    component from its smallest node, in member order: as few edges as keep the same nodes joined. Minimum
    labels spread along the edges, each round followed by pointer jumping, until none changes."""
    nodes, ends = np.unique(np.concatenate([a, b]), return_inverse=True)
    left, right = ends[:len(a)], ends[len(a):]
    label = np.arange(len(nodes))
    while True:
        low = np.minimum(label[left], label[right])
        spread = label.copy()
        np.minimum.at(spread, left, low)
        np.minimum.at(spread, right, low)
        spread = spread[spread]
        if np.array_equal(spread, label):
            break
        label = spread
    members = np.flatnonzero(label != np.arange(len(nodes)))
    return nodes[label[members]], nodes[members]


def _small_bucket_pairs(sigs: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                        threshold: int, most: int = SMALL_BUCKET) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """The near pairs (a, b) of every bucket of 2 to `most` signatures, the pairs of all those buckets compared at
    once (most buckets hold 2-5: a call per bucket, or per size, cost more than its comparisons), about
    `PAIRS_AT_ONCE` pairs at a time."""
    small = (sizes > 1) & (sizes <= most)
    starts, sizes = starts[small], sizes[small]
    pairs = sizes * (sizes - 1) // 2
    block = (np.cumsum(pairs) - pairs) // PAIRS_AT_ONCE  # buckets whose pairs start in one block go together
    cuts = np.r_[0, np.flatnonzero(np.diff(block)) + 1, len(sizes)].tolist()
    for lo, hi in itertools.pairwise(cuts):
        first, second = _pairs_in(starts[lo:hi], sizes[lo:hi])
        a, b = sigs[first], sigs[second]
        near = np.bitwise_count(a ^ b) <= threshold
        if near.any():
            yield a[near], b[near]


def _pairs_in(starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j), i < j, of positions in one bucket, for buckets of `sizes` positions from `starts`."""
    rank = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # a position's place in its bucket
    later = np.repeat(sizes, sizes) - 1 - rank  # positions after it in its bucket
    first = np.repeat(np.repeat(starts, sizes) + rank, later)
    step = np.arange(int(later.sum())) - np.repeat(np.cumsum(later) - later, later) + 1
    return first, first + step
