"""A split's shards once its runs are encoded: exact sizes, and each shard as pieces of the runs.

The split's usable records (those encoded, less any dropped as duplicates) number N; its S shards hold
N // S records each and the first N % S one more, so sizes differ by at most one. Shard i < R (R runs) is
run i's first records: when the run has at least as many as the shard needs, the shard is that prefix of
the run byte for byte, written once (`ShardPlan.prefix`). What every run holds beyond its shard (its tail),
taken run by run in order, fills the shards that still need records: a core shard whose run fell short (a
deficit: many rejects in it), then the spill shards R..S-1. Everything depends only on the counts, so the
same records always give the same shards.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shard_utils.errors import InternalError, PlanError
from shard_utils.sharding import plan
from shard_utils.sharding.carry import Carried
from shard_utils.sharding.fragments import Slice
from shard_utils.sharding.run_plan import SplitLayout

__all__ = ["RunCount", "Piece", "ShardPlan", "SplitShards", "shard_count", "plan_split_shards"]


@dataclass(frozen=True)
class RunCount:
    """What planning needs of an encoded run: its usable records and where its first dropped one sits."""

    run: int
    records: int  # usable: encoded and not dropped
    first_dropped: int | None = None  # position in the run of its first record dropped as a duplicate


@dataclass(frozen=True)
class Piece:
    """`count` usable records of run `run`, from its usable record `first` on (0-based, in key order)."""

    run: int
    first: int
    count: int


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its pieces in the order they are written. `prefix`: it is exactly the first
    `num_records` records of one run, so that run's first bytes are the shard. A reshard's shard has slices
    of fragments instead (`fragments.Slice`), whose records interleave: they are merged in key order."""

    split: str
    shard: int
    num_shards: int
    pieces: tuple[Piece, ...] = ()
    prefix: bool = False
    slices: tuple[Slice, ...] = ()

    @property
    def num_records(self) -> int:
        return sum(p.count for p in self.pieces) + sum(s.count for s in self.slices)


@dataclass(frozen=True)
class SplitShards:
    """A split's shards after encoding; `carried`: the latest generation whose records they also hold (an append)."""

    split: str
    num_records: int
    shards: tuple[ShardPlan, ...]
    carried: Carried | None = None

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def sizes(self) -> list[int]:
        return [s.num_records for s in self.shards]


def shard_count(layout: SplitLayout, usable: int, *, num_cores: int, num_hosts: int, forced: int | None) -> int:
    """The layout's shard count, lowered to the largest multiple of cores x hosts the usable records fill
    when files were rejected; a PlanError when they cannot fill one shard per core (or a forced count)."""
    unit = num_cores * num_hosts
    where = f"split {layout.split!r}: "
    if forced is not None and usable < forced:
        raise PlanError(f"{where}--num-shards {forced} is more than its {usable} records; shards would be empty")
    if usable < unit:
        raise PlanError(
            f"{where}{usable} records cannot fill {unit} shards (num_cores x num_hosts) without empty ones; "
            f"add images, lower --num-cores/--num-hosts, or change --splits")
    return min(layout.num_shards, usable // unit * unit)


def plan_split_shards(layout: SplitLayout, runs: Sequence[RunCount], *, num_cores: int, num_hosts: int,
                      forced: int | None = None) -> SplitShards:
    """Every shard of the split as pieces of its runs (see the module's docstring)."""
    ordered = sorted(runs, key=lambda r: r.run)
    if [r.run for r in ordered] != list(range(layout.num_runs)):
        raise InternalError(f"split {layout.split!r}: expected runs 0..{layout.num_runs - 1}, got "
                                 f"{len(ordered)} runs")
    usable = sum(r.records for r in ordered)
    count = shard_count(layout, usable, num_cores=num_cores, num_hosts=num_hosts, forced=forced)
    sizes = plan.shard_sizes(usable, count)
    takes = [min(r.records, sizes[r.run]) if r.run < count else 0 for r in ordered]
    tails = _tails(ordered, takes)
    shards = []
    for shard, size in enumerate(sizes):
        own = takes[shard] if shard < len(takes) else 0
        pieces = [Piece(shard, 0, own)] if own else []
        pieces += _deal(tails, size - own)
        run = ordered[shard] if shard < len(ordered) else None
        prefix = (run is not None and own == size and
                  (run.first_dropped is None or run.first_dropped >= size))
        shards.append(ShardPlan(layout.split, shard, count, tuple(pieces), prefix))
    if not tails.exhausted():
        raise InternalError(f"split {layout.split!r}: records were left over after every shard was filled")
    return SplitShards(layout.split, usable, tuple(shards))


class _Tails:
    """The runs' tails as one sequence of pieces, taken from in order."""

    def __init__(self, pieces: Iterator[Piece]):
        self._pieces = pieces
        self._current: Piece | None = None

    def take(self, n: int) -> list[Piece]:
        out = []
        while n:
            if self._current is None:
                self._current = next(self._pieces, None)
                if self._current is None:
                    raise InternalError("the runs' tails ran out before every shard was filled")
            p = self._current
            got = min(n, p.count)
            out.append(Piece(p.run, p.first, got))
            n -= got
            self._current = Piece(p.run, p.first + got, p.count - got) if got < p.count else None
        return out

    def exhausted(self) -> bool:
        if self._current is None:
            self._current = next(self._pieces, None)
        return self._current is None


def _tails(runs: Sequence[RunCount], takes: Sequence[int]) -> _Tails:
    return _Tails(Piece(r.run, take, r.records - take) for r, take in zip(runs, takes, strict=True) if r.records > take)


def _deal(tails: _Tails, n: int) -> list[Piece]:
    return tails.take(n) if n > 0 else []
