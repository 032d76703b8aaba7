"""Writing one shard from its slices of the fragments, without Beam (so local worker processes can do it).

The writer reads its slices in windows (so what it holds is bounded, whatever the shard's size),
merges the sorted runs in key order, writes the shard and its index rows under the run's temporary
folder, and checks it got the planned count. A shard planned from runs (`write_once`) is the run
itself, or byte ranges of runs copied in order: only its index is written then.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from shard_utils import fragments, index, plan, schema, storage, write_once

from .config import BuildConfig, RunInfo
from .publish import ShardResult, crash_point, keep_lease


@dataclass(frozen=True)
class ShardTask:
    """One shard to write: where it goes, its slices, and its split's plan."""

    split: str
    shard: int
    pieces: tuple[fragments.Slice, ...]
    split_plan: plan.SplitPlan


@dataclass(frozen=True)
class Written:
    """A written shard and what the job counts of it."""

    result: ShardResult
    fragment_bytes_read: int  # or, for a shard of runs, the bytes copied from them


def write_shards(tasks: Sequence[ShardTask], config: BuildConfig, run: RunInfo,
                 dropped: frozenset = frozenset()) -> list[Written]:
    """write_shard over a batch of tasks: the unit of work of a local worker process."""
    return [write_shard(task, config, run, dropped) for task in tasks]


def write_shard(task: ShardTask, config: BuildConfig, run: RunInfo, dropped: Iterable[str] = ()) -> Written:
    """Read the shard's slices (in windows), merge them in key order, write the shard and its index."""
    gone = frozenset(dropped)
    keep_lease(config, run)
    pieces = sorted(task.pieces, key=lambda s: (s.fragment, s.start))
    window = fragments.window_for(len(pieces))
    runs = [fragments.read_slice(piece, window) for piece in pieces]
    read = sum(piece.length for piece in pieces)
    name = plan.shard_name(task.split, task.shard, task.split_plan.num_shards, config.shard_extension)
    temp_path = storage.join(run.temp_dir, "shards", name)
    digest = storage.Digest()
    classes: Counter = Counter()
    longest: Counter = Counter()  # the longest list of each list feature, for the manifest's max_length
    rows = []
    crash_point("write")
    with storage.open_write(temp_path) as out:
        for meta, data in fragments.merge(runs):
            if meta.source_id in gone:
                continue
            rows.append(index.row_from_meta(task.shard, digest.size, meta, config.listing.extras, multi_label=True))
            out.write(data)
            digest.update(data)
            classes.update(meta.labels)
            _note_lengths(longest, meta)
    expected = task.split_plan.sizes[task.shard]
    if len(rows) != expected:
        raise plan.InternalError(f"shard {task.shard} of split {task.split!r} got {len(rows)} records, "
                                 f"planned {expected}")
    checksums = (digest.size, digest.crc32c, digest.sha256)
    return Written(_indexed(task.split, task.shard, name, temp_path, checksums, rows, classes, longest, config, run),
                   read)


def _indexed(split: str, shard: int, name: str, path: str, checksums: tuple[int, str, str], rows: list,
             classes: Counter, longest: Counter, config: BuildConfig, run: RunInfo) -> ShardResult:
    """Write a written shard's index rows beside it and describe the shard for publishing."""
    index_part = storage.join(run.temp_dir, "index", name + ".avro")
    with storage.open_write(index_part) as out:
        index.write_index(out, rows, index.index_schema(config.listing.extras))
    size, crc32c, sha256 = checksums
    return ShardResult(split, shard, path, name, len(rows), size, crc32c, sha256, tuple(sorted(classes.items())),
                       index_part, tuple(sorted(longest.items())))


COPY_BLOCK = 4 * 2**20  # bytes copied from a run at a time


def write_run_shards(tasks: Sequence[write_once.ShardFromRuns], config: BuildConfig, run: RunInfo) -> list[Written]:
    """write_run_shard over a batch of tasks: the unit of work of a local worker process."""
    return [write_run_shard(task, config, run) for task in tasks]


def write_run_shard(task: write_once.ShardFromRuns, config: BuildConfig, run: RunInfo) -> Written:
    """A shard of runs: the one run it is (nothing copied), or its pieces copied in order; then its index."""
    keep_lease(config, run)
    crash_point("write")
    name = plan.shard_name(task.split, task.shard, task.num_shards, config.shard_extension)
    if task.whole:
        path, copied = task.pieces[0].path, 0
        storage.sync(path)  # its flush began when the run was written: usually done by now
        size, crc32c, sha256 = task.num_bytes, task.crc32c, task.sha256
    else:
        path = storage.join(run.temp_dir, "shards", name)
        digest = storage.Digest()
        with storage.open_write(path) as out:
            for piece in task.pieces:
                for at in range(piece.start, piece.start + piece.length, COPY_BLOCK):
                    data = storage.read_range(piece.path, at, min(COPY_BLOCK, piece.start + piece.length - at))
                    out.write(data)
                    digest.update(data)
        size, crc32c, sha256, copied = digest.size, digest.crc32c, digest.sha256, digest.size
    if task.described is not None:  # the run was written as this very shard, its index part beside it
        part = task.described
        _check_size(task, size, task.pieces[0].length)
        return Written(ShardResult(task.split, task.shard, path, name, task.pieces[0].count, size, crc32c, sha256,
                                   part.classes, part.path, part.longest), copied)
    metas = [m for piece in task.pieces for m in piece.metas()]
    _check_size(task, size, sum(m.length for m in metas))
    rows, classes, longest = describe(task.shard, metas, config.listing.extras)
    return Written(_indexed(task.split, task.shard, name, path, (size, crc32c, sha256), rows, classes, longest,
                            config, run), copied)


def _check_size(task: write_once.ShardFromRuns, size: int, lengths: int) -> None:
    if size != lengths:
        raise plan.InternalError(f"shard {task.shard} of split {task.split!r} holds {size} bytes, its "
                                 f"records' lengths add up to {lengths}")


def describe(shard: int, metas: Sequence, extras: Sequence[schema.ExtraSpec]) -> tuple[list, Counter, Counter]:
    """A shard's index rows (its records' metadata in order), records per label, and longest list per feature."""
    rows, classes, longest, offset = [], Counter(), Counter(), 0
    for meta in metas:
        rows.append(index.row_from_meta(shard, offset, meta, extras, multi_label=True))
        offset += meta.length
        classes.update(meta.labels)
        _note_lengths(longest, meta)
    return rows, classes, longest


def index_run(shard: int, metas: Sequence, extras: Sequence[schema.ExtraSpec], path: str) -> write_once.RunIndex:
    """Write a run's index part as if it were all of `shard` (the guess), for the writer to take if it is."""
    rows, classes, longest = describe(shard, metas, extras)
    with storage.open_write(path, durable=False) as out:  # merged into the durable index when publishing
        index.write_index(out, rows, index.index_schema(extras))
    return write_once.RunIndex(shard, path, tuple(sorted(classes.items())), tuple(sorted(longest.items())))


def _note_lengths(longest: Counter, meta) -> None:
    for key in (schema.LABEL, schema.LABEL_TEXT):  # a record holds as many label texts as label ids
        longest[key] = max(longest[key], len(meta.labels))
    for name, values in meta.extras:
        key = schema.EXTRA_PREFIX + name
        longest[key] = max(longest[key], len(values))
