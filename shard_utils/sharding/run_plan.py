"""The layout of a split before anything is encoded: how many shards, and which listed items form each run
(a reshard's layout, made from its copied records, has one run per shard: `plan_exact_layouts`).

A record's place in its split's order is a seeded hash of its source id, so it is known from the listing
alone. The split's listed items, in that order, are cut into `num_runs` contiguous runs of equal length
(differing by at most one item); a run is encoded by one worker, in order, into one file. The shard count
comes from the listing too: its item count and an estimate of the records' bytes (the files' sizes scaled
by what a small sample of them became when encoded).

Runs are a little longer than shards when the split has enough shards (`spill_shards`): every shard but
the last few is then a prefix of one run, whatever files turn out to be unusable, and the runs' tails fill
the last few (`shards.plan_shards`).

Finding where runs start without sorting the listing: counts per hash bucket (a sparse histogram of the
keys' top bits) give the bucket and position of each run's first item; only the keys of those few buckets
are then sorted (`BoundaryFinder`).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from shard_utils.errors import InternalError, PlanError
from shard_utils.sharding import plan
from shard_utils.sharding.plan import DEFAULT_BUCKET_BITS, bucket_of

__all__ = [
    "SPILL_DIVISOR", "RECORD_OVERHEAD", "PENDING_KEYS", "UNSIZED_GUESS", "OrderKey", "BucketCounts", "ListingTotals",
    "SizeSample", "estimated_bytes", "spill_shards", "SplitLayout", "plan_layout", "plan_exact_layouts", "plan_layouts",
    "BoundaryFinder"
]

SPILL_DIVISOR = 16  # a split of S shards has S // 16 spill shards: its runs are about 1/16 longer than shards
RECORD_OVERHEAD = 400  # bytes a record adds to its source file (features, framing), when nothing better is known
PENDING_KEYS = 4096  # keys a histogram holds back before merging them, at least
UNSIZED_GUESS = 100_000  # bytes per record assumed for items of unknown size when no sample could be encoded

OrderKey = tuple  # (sort_key, source_id)


@dataclass
class BucketCounts:
    """A sparse histogram of sort keys by bucket: sorted bucket numbers and their counts.

    Keys added a chunk at a time wait in `pending` until they are as many as the buckets held, then go in
    together: adding a chunk does not go over every bucket held, whatever the number of chunks."""

    bits: int = DEFAULT_BUCKET_BITS
    buckets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pending: list[np.ndarray] = field(default_factory=list, repr=False)  # bucket of each key not merged yet
    pending_keys: int = field(default=0, repr=False)

    def add_keys(self, sort_keys: Sequence[int]) -> None:
        if not len(sort_keys):
            return
        keys = np.fromiter(sort_keys, dtype=np.uint64, count=len(sort_keys))
        found = (keys >> np.uint64(64 - self.bits)).astype(np.int64) if self.bits else np.zeros(len(keys), np.int64)
        self.pending.append(found)
        self.pending_keys += len(found)
        if self.pending_keys >= max(len(self.buckets), PENDING_KEYS):
            self.flush()

    def flush(self) -> BucketCounts:
        """Merge the pending keys into the histogram (before anything reads it)."""
        if self.pending:
            found, self.pending, self.pending_keys = np.concatenate(self.pending), [], 0
            self._merge(*np.unique(found, return_counts=True))
        return self

    def merge(self, other: BucketCounts) -> None:
        self.merge_all([other])

    def merge_all(self, others: Sequence[BucketCounts]) -> None:
        """Add the counts of many histograms at once: one pass over all of their buckets, not one per histogram."""
        if any(other.bits != self.bits for other in others):
            raise InternalError(f"bucket counts of {self.bits} and {[o.bits for o in others]} bits cannot be merged")
        flushed = [o.flush() for o in others]
        if flushed:
            self._merge(np.concatenate([o.buckets for o in flushed]), np.concatenate([o.counts for o in flushed]))

    def _merge(self, buckets: np.ndarray, counts: np.ndarray) -> None:
        if not len(buckets):
            return
        self.flush()
        all_buckets = np.concatenate([self.buckets, buckets.astype(np.int64)])
        all_counts = np.concatenate([self.counts, counts.astype(np.int64)])
        self.buckets, where = np.unique(all_buckets, return_inverse=True)
        self.counts = np.bincount(where, weights=all_counts, minlength=len(self.buckets)).astype(np.int64)

    def __getstate__(self) -> dict:
        return dict(self.flush().__dict__)

    @property
    def total(self) -> int:
        return int(self.flush().counts.sum())

    def locate(self, ranks: Sequence[int]) -> list[tuple[int, int]]:
        """(bucket, position among the bucket's sorted keys) of the key of each rank (0-based)."""
        if not len(ranks):
            return []
        ends = np.cumsum(self.flush().counts)
        wanted = np.asarray(ranks, dtype=np.int64)
        if wanted.min() < 0 or wanted.max() >= (ends[-1] if len(ends) else 0):
            raise InternalError(f"rank outside the {self.total} keys counted")
        at = np.searchsorted(ends, wanted, side="right")
        before = np.where(at > 0, ends[np.maximum(at - 1, 0)], 0)
        return [(int(self.buckets[i]), int(r - b)) for i, r, b in zip(at, wanted, before, strict=True)]


@dataclass
class ListingTotals:
    """One split's listing: items, the known sizes of their files, and the histogram of their keys."""

    count: int = 0
    sized: int = 0  # items whose file size the listing gave
    source_bytes: int = 0  # the sum of those sizes
    keys: BucketCounts = field(default_factory=BucketCounts)

    def add(self, sort_keys: Sequence[int], sizes: Sequence[int]) -> None:
        self.count += len(sort_keys)
        known = [s for s in sizes if s > 0]
        self.sized += len(known)
        self.source_bytes += sum(known)
        self.keys.add_keys(sort_keys)

    def merge(self, other: ListingTotals) -> None:
        self.merge_all([other])

    def merge_all(self, others: Sequence[ListingTotals]) -> None:
        self.count += sum(o.count for o in others)
        self.sized += sum(o.sized for o in others)
        self.source_bytes += sum(o.source_bytes for o in others)
        self.keys.merge_all([o.keys for o in others])


@dataclass(frozen=True)
class SizeSample:
    """What a sample of the listing became when encoded: its files' bytes, its records' bytes, how many."""

    source_bytes: int = 0
    record_bytes: int = 0
    records: int = 0

    def merge(self, other: SizeSample) -> SizeSample:
        return SizeSample(self.source_bytes + other.source_bytes, self.record_bytes + other.record_bytes,
                          self.records + other.records)


def estimated_bytes(totals: ListingTotals, sample: SizeSample) -> int:
    """The split's records' bytes, estimated: known file sizes scaled by the sample's records-to-files ratio,
    items of unknown size at the sample's mean record size."""
    unsized = totals.count - totals.sized
    if sample.records and sample.source_bytes:
        ratio = sample.record_bytes / sample.source_bytes
        mean = sample.record_bytes / sample.records
        return int(totals.source_bytes * ratio + unsized * mean)
    mean = (totals.source_bytes / totals.sized if totals.sized else UNSIZED_GUESS)
    return int(totals.source_bytes + unsized * mean + RECORD_OVERHEAD * totals.count)


def spill_shards(num_shards: int) -> int:
    """Shards filled from the runs' tails rather than being a prefix of a run of their own."""
    return num_shards // SPILL_DIVISOR


@dataclass(frozen=True)
class SplitLayout:
    """A split's plan before encoding: listed items, shard count, runs, and the keys where runs start.

    `boundary_slots` locate the first item of runs 1..R-1 as (hash bucket, position in the bucket's sorted
    keys); `boundaries` are those items' keys, once found (`with_boundaries`).
    """

    split: str
    num_listed: int
    estimated_bytes: int
    num_shards: int
    num_runs: int
    bucket_bits: int = DEFAULT_BUCKET_BITS
    boundary_slots: tuple[tuple[int, int], ...] = ()
    boundaries: tuple[OrderKey, ...] | None = None

    @cached_property
    def boundary_buckets(self) -> frozenset[int]:
        """The buckets where some run starts: made once per layout, as every listed item is tested against it."""
        return frozenset(b for b, _ in self.boundary_slots)

    @cached_property
    def slots_by_bucket(self) -> Mapping[int, tuple[tuple[int, int], ...]]:
        """{bucket: ((slot number, position in the bucket's sorted keys), ...)}: the run starts of each bucket."""
        out: dict[int, list[tuple[int, int]]] = {}
        for slot, (b, position) in enumerate(self.boundary_slots):
            out.setdefault(b, []).append((slot, position))
        return {b: tuple(found) for b, found in out.items()}

    def __getstate__(self) -> dict:
        """The fields only: what is derived from them is made again where it is used, not shipped."""
        return {name: value for name, value in self.__dict__.items() if name not in _DERIVED}

    def run_size(self, run: int) -> int:
        """Items of one run (runs differ by at most one)."""
        q, r = divmod(self.num_listed, self.num_runs)
        return q + 1 if run < r else q

    def run_of(self, key: OrderKey) -> int:
        """The run an item of this key belongs to."""
        return self.runs_of([tuple(key)])[0]

    def runs_of(self, keys: Iterable[OrderKey]) -> list[int]:
        """The run of each of these keys (tuples, as `OrderKey`s are made): `run_of` for many at once."""
        if self.boundaries is None:
            raise InternalError(f"split {self.split!r}: run boundaries are not known yet")
        after, boundaries = bisect.bisect_right, self.boundaries
        return [after(boundaries, key) for key in keys]


_DERIVED = frozenset(("boundary_buckets", "slots_by_bucket"))


def plan_layout(split: str, totals: ListingTotals, sample: SizeSample, *, num_cores: int, num_hosts: int,
                target_shard_bytes: int, forced: int | None = None) -> SplitLayout:
    """The split's shard count and runs. Listed items too few for cores x hosts shards (or for a forced count)
    still get a layout, one run per item: they are encoded, so that the error names what could be used and
    why the rest was rejected (`shards.shard_count`)."""
    estimate = estimated_bytes(totals, sample)
    try:
        count = plan.num_shards(totals.count, estimate, num_cores=num_cores, num_hosts=num_hosts,
                                target_shard_bytes=target_shard_bytes, forced=forced, split=split)
    except PlanError:
        count = totals.count
    return _layout(split, totals, estimate, count, count - spill_shards(count))


def plan_exact_layouts(totals: Mapping[str, ListingTotals], *, num_cores: int, num_hosts: int,
                       target_shard_bytes: int, forced: int | None = None,
                       remedy: str = plan.RESHARD_REMEDY) -> dict[str, SplitLayout]:
    """Layouts for splits whose records are all written already (a reshard: `source_bytes` are the records' own
    bytes, and none can be rejected): one run per shard, so a run is a shard; PlanError when a split cannot be
    cut into cores x hosts shards."""
    if not any(t.count for t in totals.values()):
        raise PlanError("no input file could be used (0 records)")
    out = {}
    for split, t in sorted(totals.items()):
        count = plan.num_shards(t.count, t.source_bytes, num_cores=num_cores, num_hosts=num_hosts,
                                target_shard_bytes=target_shard_bytes, forced=forced, split=split, remedy=remedy)
        out[split] = _layout(split, t, t.source_bytes, count, count)
    return out


def _layout(split: str, totals: ListingTotals, num_bytes: int, num_shards: int, num_runs: int) -> SplitLayout:
    """The layout of `num_shards` shards over `num_runs` runs of equal length, with the slots where runs start."""
    starts = plan.shard_starts(totals.count, num_runs)[1:]
    return SplitLayout(split, totals.count, num_bytes, num_shards, num_runs, totals.keys.bits,
                       tuple(totals.keys.locate(starts)))


def plan_layouts(totals: Mapping[str, ListingTotals], sample: SizeSample, *, expected_splits: Sequence[str],
                 num_cores: int, num_hosts: int, target_shard_bytes: int,
                 forced: int | None = None) -> dict[str, SplitLayout]:
    """Layouts for every split that has listed items; a split named in --splits that got none is a PlanError."""
    found = {name: t for name, t in totals.items() if t.count}
    if not found:
        raise PlanError("no input file could be used (0 records)")
    missing = [name for name in expected_splits if name not in found]
    if missing:
        raise PlanError(f"split {missing[0]!r} received no records from --splits; give it a larger fraction or "
                             "add images")
    return {name: plan_layout(name, t, sample, num_cores=num_cores, num_hosts=num_hosts,
                              target_shard_bytes=target_shard_bytes, forced=forced)
            for name, t in sorted(found.items())}


class BoundaryFinder:
    """Finds a split's run boundaries from the keys of its boundary buckets, bucket by bucket."""

    @staticmethod
    def wanted(layout: SplitLayout, sort_key: int) -> bool:
        """Whether an item of this sort key lies in a bucket where some run starts."""
        return bucket_of(sort_key, layout.bucket_bits) in layout.boundary_buckets

    @staticmethod
    def picks(layout: SplitLayout, bucket: int, keys: Iterable[OrderKey]) -> list[tuple[int, OrderKey]]:
        """(slot number, key) of every run start that lies in this bucket, from all of the bucket's keys."""
        ordered = sorted(tuple(k) for k in keys)
        out = []
        for slot, position in layout.slots_by_bucket.get(bucket, ()):
            if position >= len(ordered):
                raise InternalError(f"split {layout.split!r}: bucket {bucket} holds {len(ordered)} keys, "
                                         f"a run starts at its key {position}")
            out.append((slot, ordered[position]))
        return out

    @staticmethod
    def complete(layout: SplitLayout, picked: Iterable[tuple[int, OrderKey]]) -> SplitLayout:
        """The layout with its boundaries, from every (slot, key) the buckets gave."""
        found = dict(picked)
        if sorted(found) != list(range(len(layout.boundary_slots))):
            raise InternalError(f"split {layout.split!r}: {len(found)} of its "
                                     f"{len(layout.boundary_slots)} run boundaries were found")
        return replace(layout, boundaries=tuple(tuple(found[i]) for i in range(len(found))))
