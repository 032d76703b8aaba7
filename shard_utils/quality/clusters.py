"""Near-duplicate clusters from 64-bit perceptual signatures, without comparing all pairs (pure functions).

Locality-sensitive keys: the 64 bits are shuffled by `permutations` fixed, seeded permutations and each
shuffle is cut into 4 disjoint bands of 16 bits; a band key is (band number, the band's 16 bits). Two
signatures that share a band key are candidates, and only candidates are compared, by full Hamming
distance. A pair `d` bits apart shares some band of one permutation with probability

    q(d) = sum_{j=1..4} (-1)^(j+1) C(4, j) C(64 - 16 j, d) / C(64, d)     (inclusion-exclusion: a clean band)

and some band of any permutation with `1 - (1 - q(d))^P` (the permutations are independent). `permutations_for`
takes the least P that finds a pair at the threshold with probability `TARGET_RECALL`: at 10 bits, q = 0.170
and P = 17 (68 bands) find 95.8 % of the pairs exactly 10 bits apart, 99.98 % of those 6 apart, every pair 0-3
apart. Closer pairs are the common case (a resized or re-compressed copy differs in a few bits).

Equal signatures are first collapsed to one (their smallest source id), so a flat image shared by thousands
of files is one candidate, not thousands. A band bucket of more than `MAX_BUCKET` distinct signatures (a
"hot" bucket) is cut, in signature order, into blocks of `MAX_BUCKET`, and pairs are verified inside each
block only: a pair split over two blocks is found by another band or not at all (counted, never silent).

Verified pairs are joined into clusters by union-find (transitively: a chain of near pairs is one cluster).
A cluster's kept member is its first by (new to the dataset, source id): the dataset's own record on an
append, else the smallest source id; its id is a hash of that member's source id, so the same input gives the
same ids whatever the order the pairs arrive in.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from math import comb, log

import numpy as np

__all__ = ["Banding", "Cluster", "Member", "UnionFind", "band_recall", "clusters_of", "find_clusters",
           "permutations_for", "verified_edges"]

BITS = 64
BAND_BITS = 16
BANDS_PER_PERMUTATION = BITS // BAND_BITS
TARGET_RECALL = 0.95
MAX_BUCKET = 4096  # distinct signatures of one band bucket compared all pairs at once; more: in blocks
FEW = 16  # a block of at most this many signatures is compared in plain ints (faster than numpy up to about 16)
PERMUTATION_SEED = 20261126  # fixed: band keys (and so which far pairs are found) never change between builds
MAX_PERMUTATIONS = 64


def clean_band_probability(distance: int) -> float:
    """q(d): the probability that a pair `distance` bits apart (at random positions) has a band of one
    permutation in which it does not differ."""
    if distance <= BANDS_PER_PERMUTATION - 1:
        return 1.0  # pigeonhole: fewer differing bits than bands leaves a band clean
    return sum((-1) ** (j + 1) * comb(BANDS_PER_PERMUTATION, j) * comb(BITS - BAND_BITS * j, distance)
               for j in range(1, BANDS_PER_PERMUTATION + 1)) / comb(BITS, distance)


def band_recall(distance: int, permutations: int) -> float:
    """The probability that a pair `distance` bits apart shares a band key (and so is found)."""
    q = clean_band_probability(distance)
    return 1.0 - (1.0 - q) ** permutations


def permutations_for(threshold: int, recall: float = TARGET_RECALL) -> int:
    """The least number of permutations that finds a pair `threshold` bits apart with probability `recall`."""
    if not 0 <= threshold < BITS // 2:
        raise ValueError(f"near-duplicate threshold {threshold} must be in 0..{BITS // 2 - 1} bits")
    if not 0 < recall < 1:
        raise ValueError(f"recall {recall} must be between 0 and 1")
    q = clean_band_probability(threshold)
    if q >= 1.0:
        return 1
    needed = int(np.ceil(log(1 - recall) / log(1 - q)))
    if needed > MAX_PERMUTATIONS:
        raise ValueError(f"a threshold of {threshold} bits needs {needed} permutations for {recall:.0%} recall "
                         f"(more than {MAX_PERMUTATIONS})")
    return needed


@lru_cache(maxsize=8)
def _bit_orders(permutations: int) -> np.ndarray:
    """permutations x 64 bit positions: the fixed, seeded shuffles the bands are cut from."""
    rng = np.random.default_rng(PERMUTATION_SEED)
    return np.stack([rng.permutation(BITS) for _ in range(permutations)]) if permutations else np.zeros((0, BITS),
                                                                                                        np.int64)


@dataclass(frozen=True)
class Banding:
    """How signatures are cut into band keys for a Hamming threshold (bits)."""

    threshold: int

    @cached_property
    def permutations(self) -> int:
        return permutations_for(self.threshold)

    @property
    def bands(self) -> int:
        return self.permutations * BANDS_PER_PERMUTATION

    def recall(self, distance: int) -> float:
        return band_recall(distance, self.permutations)

    def band_values(self, signatures: np.ndarray, bands: slice = slice(None)) -> np.ndarray:
        """n x bands uint16 band values of n signatures (uint64): column b is band b's 16 bits (`bands`: only
        those bands' columns)."""
        sigs = np.asarray(signatures, dtype=np.uint64).reshape(-1)
        positions = _bit_orders(self.permutations).reshape(self.bands, BAND_BITS)[bands]
        out = np.zeros((len(sigs), len(positions)), dtype=np.uint32)
        for i in range(BAND_BITS):
            bit = (sigs[:, None] >> positions[None, :, i].astype(np.uint64)) & np.uint64(1)
            out |= bit.astype(np.uint32) << np.uint32(i)
        return out.astype(np.uint16)


@dataclass(frozen=True)
class BucketOutcome:
    """A band bucket's verified pairs as a spanning forest (each edge links a member to its tree's smallest id),
    and whether the bucket was too hot to compare all its pairs."""

    edges: tuple[tuple[str, str], ...]
    blocks: int


def verified_edges(members: Iterable[tuple[int, str]], threshold: int, cap: int = MAX_BUCKET) -> BucketOutcome:
    """The near pairs among a band bucket's (signature, source id) members, as few edges as keep them joined.

    The outcome does not depend on their order: a hot bucket (over `cap`) is sorted, then cut into blocks of
    `cap`; the edges are a forest of sorted ids."""
    items = list(members)
    if len(items) > cap:
        items = sorted(set(items))
    forest = UnionFind()
    blocks = 0
    for start in range(0, len(items), cap):
        block = items[start:start + cap]
        blocks += 1
        if len(block) <= FEW:
            pairs = _near_pairs_few([s for s, _ in block], threshold)
        else:
            pairs = _near_pairs(np.fromiter((s for s, _ in block), dtype=np.uint64, count=len(block)), threshold)
        for i, j in pairs:
            forest.union(block[i][1], block[j][1])
    return BucketOutcome(tuple(forest.edges()) if forest.parent else (), blocks)


def _near_pairs_few(sigs: list[int], threshold: int) -> Iterator[tuple[int, int]]:
    """_near_pairs of a few signatures, in the same order, in plain ints: most band buckets hold 2-5, where numpy's
    fixed cost per call (about 7 us) is most of a bucket's (0.6 us for 2 here)."""
    for i, a in enumerate(sigs):
        for j in range(i + 1, len(sigs)):
            if (a ^ sigs[j]).bit_count() <= threshold:
                yield i, j


def _near_pairs(sigs: np.ndarray, threshold: int, rows: int = 256) -> Iterator[tuple[int, int]]:
    """(i, j), i < j, of the signatures at most `threshold` bits apart: `rows` of them against all at a time."""
    for start in range(0, len(sigs), rows):
        part = sigs[start:start + rows]
        near = np.bitwise_count(part[:, None] ^ sigs[None, :]) <= threshold
        ii, jj = np.nonzero(near)
        ii += start
        upper = ii < jj
        if upper.any():
            yield from zip(ii[upper].tolist(), jj[upper].tolist(), strict=True)


class UnionFind:
    """Disjoint sets of source ids; each set's root is its smallest id (so the result is order-free)."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        root = self.parent.setdefault(x, x)
        while root != self.parent[root]:
            root = self.parent[root]
        while x != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            lo, hi = (ra, rb) if ra < rb else (rb, ra)
            self.parent[hi] = lo

    def merge(self, other: UnionFind) -> None:
        for x in other.parent:
            self.union(x, other.find(x))

    def edges(self) -> Iterator[tuple[str, str]]:
        """(root, member) for every member that is not a root: a star per set, in sorted order."""
        for x in sorted(self.parent):
            root = self.find(x)
            if root != x:
                yield root, x

    def groups(self, alone: bool = False) -> list[list[str]]:
        """Every set of two or more (`alone`: and of one), each sorted, in the order of their smallest id."""
        out: dict[str, list[str]] = {}
        for x in sorted(self.parent):
            out.setdefault(self.find(x), []).append(x)
        return [members for _, members in sorted(out.items()) if alone or len(members) > 1]


@dataclass(frozen=True, order=True)
class Member:
    """A record in a cluster: where it is (`where` is (run, position) of a record this build encoded, None for
    a record already in the dataset), its split and its label ids."""

    source_id: str
    split: str
    labels: tuple[int, ...] = ()
    where: tuple[int, int] | None = None
    sha256: str = ""

    @property
    def is_new(self) -> bool:
        return self.where is not None


@dataclass(frozen=True)
class Cluster:
    """Near-duplicate records (two or more), sorted by source id; the first by (new, source id) is kept."""

    members: tuple[Member, ...]

    @cached_property
    def kept(self) -> Member:
        return min(self.members, key=lambda m: (m.is_new, m.source_id))

    @property
    def id(self) -> str:
        return hashlib.sha256(f"near-dup:{self.kept.source_id}".encode()).hexdigest()[:16]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(sorted({m.split for m in self.members}))

    @property
    def labels(self) -> tuple[tuple[int, ...], ...]:
        """The distinct label sets of its members (more than one: a label conflict)."""
        return tuple(sorted({m.labels for m in self.members}))

    @property
    def others(self) -> tuple[Member, ...]:
        """Every member but the kept one."""
        return tuple(m for m in self.members if m != self.kept)


def clusters_of(forest: UnionFind, members: dict[str, Member]) -> list[Cluster]:
    """The clusters of a union-find over source ids, in the order of their ids' smallest member."""
    return [Cluster(tuple(members[x] for x in group)) for group in forest.groups()]


def identical_edges(members: Iterable[tuple[int, str]]) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Equal signatures collapsed: {signature: its smallest source id}, and an edge from that id to each other."""
    first: dict[int, str] = {}
    everyone: dict[int, list[str]] = {}
    for sig, source_id in members:
        everyone.setdefault(sig, []).append(source_id)
    edges = []
    for sig, ids in everyone.items():
        ids.sort()
        first[sig] = ids[0]
        edges += [(ids[0], other) for other in ids[1:]]
    return first, edges


def find_clusters(records: Sequence[tuple[int, Member]], threshold: int, cap: int = MAX_BUCKET) -> list[Cluster]:
    """Every near-duplicate cluster of (signature, member) records, in one process: the reference the
    distributed job (beam_jobs.pipeline.near_dups) computes the same clusters as."""
    by_id = {m.source_id: m for _, m in records}
    distinct, edges = identical_edges((sig, m.source_id) for sig, m in records)
    banding = Banding(threshold)
    forest = UnionFind()
    for a, b in edges:
        forest.union(a, b)
    sigs = np.array(sorted(distinct), dtype=np.uint64)
    if len(sigs):
        values = banding.band_values(sigs)
        for band in range(banding.bands):
            buckets: dict[int, list[tuple[int, str]]] = {}
            for sig, value in zip(sigs.tolist(), values[:, band].tolist(), strict=True):
                buckets.setdefault(value, []).append((sig, distinct[sig]))
            for bucket in buckets.values():
                if len(bucket) > 1:
                    for a, b in verified_edges(bucket, threshold, cap).edges:
                        forest.union(a, b)
    return clusters_of(forest, by_id)
