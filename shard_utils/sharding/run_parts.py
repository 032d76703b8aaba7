"""A run encoded in parts, when a local build has more workers than runs to encode: its items, in key order,
cut into contiguous parts that workers encode at once into part files, then joined into the run's file.

Runs stay as the planner made them (which record goes to which shard never depends on the worker count); the
join feeds the parts' records, in order, to the run's own RunWriter, so the run's bytes, its per-record
checksums and its gs:// chunking are exactly those one worker would have written. Part names are fixed by
(split, run, part): a part encoded again writes the same bytes under the same names, and a join run again
(its worker killed) finds its parts, which are removed only once the build holds the joined run. No Beam.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.inputs import MediaItem
from shard_utils.sharding.encode_run import EncodedRun, EncodeTally, RunTask, item_order
from shard_utils.sharding.run_plan import SplitLayout
from shard_utils.sharding.runs import CHUNK_BYTES, RunWriter
from shard_utils.sharding.writer import read_records

__all__ = ["MIN_PART_ITEMS", "parts_per_run", "part_tasks", "join_parts", "remove_parts"]

MIN_PART_ITEMS = 8  # a part holds at least this many items: below it, a part's task costs more than it saves


def parts_per_run(layouts: Mapping[str, SplitLayout], workers: int, split: str, run: int) -> int:
    """How many parts a run of `split` is encoded in: 1 when the runs of every split keep `workers` busy;
    else enough that the parts of all runs are a multiple of the workers (each busy to the end), each part
    holding at least MIN_PART_ITEMS items."""
    runs = sum(found.num_runs for found in layouts.values())
    if workers <= 1 or runs >= workers:
        return 1
    wanted = workers // math.gcd(runs, workers)
    return max(1, min(wanted, layouts[split].run_size(run) // MIN_PART_ITEMS))


def part_tasks(task: RunTask, parts: int, seed: int) -> list[RunTask]:
    """The run's items in key order, cut into `parts` contiguous tasks whose sizes differ by at most one."""
    items: list[MediaItem] = sorted(task.items, key=lambda item: item_order(item, seed))
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for part in range(parts):
        end = start + q + (part < r)
        out.append(replace(task, items=tuple(items[start:end]), part=part))
        start = end
    return out


def join_parts(parts: Sequence[EncodedRun], folder: str, chunk_bytes: int = CHUNK_BYTES) -> EncodedRun:
    """The run whose parts these are (in part order), written under `folder` as one worker would have written
    it; its rejections and findings are the parts' in order. The part files stay (see `remove_parts`)."""
    if not parts or len({(p.split, p.run) for p in parts}) != 1:
        raise InternalError(f"parts of several runs, or none, cannot be joined: {[(p.split, p.run) for p in parts]}")
    split, run = parts[0].split, parts[0].run
    files = [p.file for p in parts if p.file is not None]
    writer = RunWriter(folder, split, run, chunk_bytes)
    try:
        for part in files:
            entries = part.entries()
            for entry, data in read_records(part, entries, range(len(entries))):
                writer.add(data, entry.meta)
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    tally = EncodeTally(*(sum(getattr(p.tally, name) for p in parts) for name in EncodeTally.__dataclass_fields__))
    return EncodedRun(split, run, written, tuple(r for p in parts for r in p.rejected), tally,
                      tuple(q for p in parts for q in p.quality))


def remove_parts(parts: Sequence[EncodedRun]) -> None:
    """Remove the files of a run's parts, once they are joined."""
    for part in parts:
        if part.file is not None:
            for path, _ in part.file.parts:
                storage.delete(path)
            storage.delete(part.file.meta_path)
