"""Shards written once: planned from the listing, encoded in key order straight into shard-sized runs.

A record's place in its split's order is a hash of its source id, known before its file is read. So a
local build can sort the listing, guess the shard plan from the source files' sizes, and have each
worker encode one planned shard's files in order into one file (a "run"). Once every run is written,
the real plan is made from what was encoded, by the same rule as ever (`plan.plan_splits`). A shard that
holds exactly one whole run is that run: written once. Rejected files, or a guess that missed, move
the boundaries; those shards are copied together from byte ranges of the runs, which lie in key order.
Either way the bytes are those of the fragment path (`fragments`): the plan and the order are the same.
Pure functions, no Beam.
"""
from __future__ import annotations

import array
import pickle
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from . import plan, storage
from .encode import RecordMeta
from .inputs import MediaItem

RECORD_OVERHEAD = 400  # bytes a record adds to its source file (features, framing): the guess's allowance
SIZE_SAMPLE = 64  # files asked for their size to guess that of files a listing names without one
GCS_SIZE_SAMPLE = 16  # of them, at most this many on gs:// (a request each)


@dataclass(frozen=True)
class RunTask:
    """Items to encode, in key order, into one run: a planned shard (or a part of one)."""

    split: str
    items: tuple[MediaItem, ...]
    shard: int | None = None  # the guessed shard it is all of (None: a part of one)


@dataclass(frozen=True)
class RunIndex:
    """A run's index part, written as if the run were all of shard `shard`, and what publishing needs of it."""

    shard: int
    path: str
    classes: tuple[tuple[int, int], ...]  # (label id, records)
    longest: tuple[tuple[str, int], ...]  # (list feature, its longest list)


@dataclass(frozen=True)
class WrittenRun:
    """A run on disk: its records' lengths (key order), where their metadata lies, and its checksums."""

    split: str
    path: str
    meta_path: str
    first: tuple[int, str]  # order key of its first record
    lengths: array.array  # framed length of each record ('Q')
    totals: plan.SplitTotals
    num_bytes: int
    crc32c: str
    sha256: str
    described: RunIndex | None = None  # its index, written for the guessed shard it is all of

    @property
    def count(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class RunPiece:
    """A contiguous range of a run's records: `count` records from record `first`, bytes from `start`."""

    path: str
    meta_path: str
    first: int
    count: int
    start: int
    length: int

    def metas(self) -> list[RecordMeta]:
        """The piece's records' metadata, in key order."""
        return read_metas(self.meta_path)[self.first:self.first + self.count]


@dataclass(frozen=True)
class ShardFromRuns:
    """One shard of the real plan and the run pieces it is made of, in key order; `whole`: it is one whole run."""

    split: str
    shard: int
    num_shards: int
    pieces: tuple[RunPiece, ...]
    whole: bool
    num_bytes: int = 0  # of a whole run, with its checksums
    crc32c: str = ""
    sha256: str = ""
    described: RunIndex | None = None  # of a whole run that was written as this very shard: its index


def order_of(item: MediaItem, splits: Sequence[tuple[str, float]], seed: int) -> tuple[str, tuple[int, str]]:
    """(split, order key) of an item, as its encoded record will have them."""
    split = item.split or plan.choose_split(list(splits), seed, item.source_id)
    return split, (plan.sort_key(seed, item.source_id), item.source_id)


def guess_shards(items: Sequence[MediaItem], *, num_cores: int, num_hosts: int, target_shard_bytes: int,
                 forced: int | None) -> int:
    """The shard count the real plan will likely have, from the source files' sizes (at least 1)."""
    unit = num_cores * num_hosts
    if forced is not None:
        return max(1, min(forced, len(items)))
    if len(items) < unit:
        return 1
    estimate = source_bytes(items) + RECORD_OVERHEAD * len(items)
    return plan.num_shards(len(items), estimate, num_cores=num_cores, num_hosts=num_hosts,
                           target_shard_bytes=target_shard_bytes)


def source_bytes(items: Sequence[MediaItem]) -> int:
    """The source files' bytes, for the guess: the sizes the walk found; for files a listing names without
    sizes, their mean over a sample (the first SIZE_SAMPLE in key order, a sample of the hash order; at
    most GCS_SIZE_SAMPLE of them on gs://)."""
    unknown = [item for item in items if not item.size]
    known = sum(item.size for item in items)
    sampled, asked_gcs = [], 0
    for item in unknown[:SIZE_SAMPLE]:
        if storage.is_gcs(item.uri):
            if asked_gcs == GCS_SIZE_SAMPLE:
                continue
            asked_gcs += 1
        try:
            sampled.append(storage.size(item.uri))
        except storage.StorageError:  # missing or unreadable: the encode step rejects it
            continue
    return known + (sum(sampled) * len(unknown) // len(sampled) if sampled else 0)


def run_tasks(items: Iterable[MediaItem], *, splits: Sequence[tuple[str, float]], seed: int, num_cores: int,
              num_hosts: int, target_shard_bytes: int, forced: int | None, workers: int) -> list[RunTask]:
    """The runs to encode: each split's items in key order, cut where the guessed plan cuts its shards,
    and each shard cut further until there are at least two runs per worker (so every worker is busy)."""
    by_split: dict[str, list[tuple[tuple[int, str], MediaItem]]] = {}
    for item in items:
        split, key = order_of(item, splits, seed)
        by_split.setdefault(split, []).append((key, item))
    counts: dict[str, int] = {}
    for split, keyed in by_split.items():
        keyed.sort(key=lambda pair: pair[0])
        counts[split] = guess_shards([item for _, item in keyed], num_cores=num_cores, num_hosts=num_hosts,
                                     target_shard_bytes=target_shard_bytes, forced=forced)
    shards = sum(counts.values())
    parts = max(1, -(-2 * workers // shards)) if shards else 1  # runs per shard
    tasks = []
    for split, keyed in sorted(by_split.items()):
        ordered = [item for _, item in keyed]
        starts, sizes = plan.shard_starts(len(ordered), counts[split]), plan.shard_sizes(len(ordered), counts[split])
        for shard, (lo, size) in enumerate(zip(starts, sizes)):
            for plo, psize in zip(plan.shard_starts(size, min(parts, size)), plan.shard_sizes(size, min(parts, size))):
                tasks.append(RunTask(split, tuple(ordered[lo + plo:lo + plo + psize]),
                                     shard if min(parts, size) == 1 else None))
    return tasks


def split_totals(runs: Iterable[WrittenRun]) -> dict[str, plan.SplitTotals]:
    """{split: SplitTotals} over the written runs: what the real plan is made from."""
    out: dict[str, plan.SplitTotals] = {}
    for run in runs:
        out.setdefault(run.split, plan.SplitTotals()).merge(run.totals)
    return out


def assign(runs: Iterable[WrittenRun], plans: Mapping[str, plan.SplitPlan]) -> list[ShardFromRuns]:
    """Every shard of the real plans as pieces of the runs: shard i of a split holds the records of ranks
    starts[i]..starts[i+1]-1 of the split's order, and the runs, sorted by first key, are that order."""
    by_split: dict[str, list[WrittenRun]] = {}
    for run in runs:
        by_split.setdefault(run.split, []).append(run)
    out = []
    for split, split_plan in sorted(plans.items()):
        ordered = sorted(by_split.get(split, []), key=lambda r: r.first)
        if sum(r.count for r in ordered) != split_plan.num_records:
            raise plan.InternalError(f"split {split!r}: the runs hold {sum(r.count for r in ordered)} records, "
                                     f"the plan {split_plan.num_records}")
        pieces = _cut(ordered, split_plan.sizes)
        for shard, shard_pieces in enumerate(pieces):
            whole = len(shard_pieces) == 1 and shard_pieces[0][1].count == shard_pieces[0][0].count
            run = shard_pieces[0][0] if whole else None
            described = run.described if run and run.described and run.described.shard == shard else None
            out.append(ShardFromRuns(split, shard, split_plan.num_shards, tuple(p for _, p in shard_pieces), whole,
                                     run.num_bytes if run else 0, run.crc32c if run else "",
                                     run.sha256 if run else "", described))
    return out


def _cut(runs: Sequence[WrittenRun], sizes: Sequence[int]) -> list[list[tuple[WrittenRun, RunPiece]]]:
    """The pieces of each shard, taking `sizes[i]` records for shard i from the runs in order."""
    shards: list[list[tuple[WrittenRun, RunPiece]]] = []
    at_run, at_record, at_byte = 0, 0, 0
    for size in sizes:
        mine: list[tuple[WrittenRun, RunPiece]] = []
        need = size
        while need:
            run = runs[at_run]
            take = min(need, run.count - at_record)
            length = sum(run.lengths[at_record:at_record + take])
            mine.append((run, RunPiece(run.path, run.meta_path, at_record, take, at_byte, length)))
            need -= take
            at_record, at_byte = at_record + take, at_byte + length
            if at_record == run.count:
                at_run, at_record, at_byte = at_run + 1, 0, 0
        shards.append(mine)
    return shards


def write_metas(path: str, metas: Sequence[RecordMeta]) -> None:
    """A run's records' metadata, in key order, as one file beside it (scratch: a rerun writes its own)."""
    with storage.open_write(path, durable=False) as out:
        out.write(pickle.dumps(list(metas), protocol=pickle.HIGHEST_PROTOCOL))


def read_metas(path: str) -> list[RecordMeta]:
    """A run's records' metadata (write_metas)."""
    return pickle.loads(storage.read_bytes(path))
