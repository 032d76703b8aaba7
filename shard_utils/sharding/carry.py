"""Small appends: a split's new records too few for shards of their own join the split's latest generation.

An appended generation holds a multiple of cores x hosts shards, none empty, so a split that gets fewer new
records than cores x hosts cannot have a generation of its own. Its latest generation is then written again
together with them: each of its shards is streamed (both CRCs and the manifest's checksums checked, nothing
decoded) into a run of its own, in place order, and those runs come before the new records' runs when the
split's shards are planned. The new generation replaces the latest one: it takes its place among the split's
shards, and the replaced shards are removed once the new manifest is in place.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shard_utils import storage
from shard_utils.format import generations, schema
from shard_utils.format.index import IndexRow, read_index
from shard_utils.format.manifest import Manifest, Shard
from shard_utils.sharding.copy_records import DamagedShard, shard_records
from shard_utils.sharding.runs import RunFile, RunWriter

__all__ = [
    "CARRY_FOLDER", "LatestGeneration", "latest_generations", "carried_splits", "CarryTask", "CarriedRun", "Carried",
    "carry_tasks", "carry_shard", "carried_of"
]

CARRY_FOLDER = "carried"  # under a run's temporary folder: the runs copied from a latest generation


@dataclass(frozen=True)
class LatestGeneration:
    """A split's latest generation, as an append may replace it: its shards (the split's last ones, from place
    `first_place` on) and where a generation replacing it starts so that hosts stay balanced."""

    split: str
    generation: int
    first_place: int
    shards: tuple[Shard, ...]
    host_offset: int

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)


def latest_generations(m: Manifest, unit: int) -> dict[str, LatestGeneration]:
    """Every split's latest generation (`unit`: cores x hosts)."""
    out = {}
    for name, split in m.splits.items():
        if not split.shards:
            continue
        g = split.shards[-1].generation
        first = next(i for i, s in enumerate(split.shards) if s.generation == g)
        kept = [s.num_records for s in split.shards[:first]]
        out[name] = LatestGeneration(name, g, first, tuple(split.shards[first:]),
                                     generations.host_offset(kept, unit) if kept else 0)
    return out


def carried_splits(usable: Mapping[str, int], unit: int) -> list[str]:
    """The splits whose new records (some, fewer than `unit`) join their latest generation."""
    return sorted(name for name, n in usable.items() if 0 < n < unit)


@dataclass(frozen=True)
class CarryTask:
    """One shard of a latest generation to copy into a run: its split, its position in the generation, where
    it is, its manifest entry and its index rows."""

    split: str
    position: int
    uri: str
    shard: Shard
    rows: tuple[IndexRow, ...]


@dataclass(frozen=True)
class CarriedRun:
    """A shard of a latest generation copied into a run, and its records per label id."""

    split: str
    position: int
    file: RunFile
    classes: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Carried:
    """What a split's new generation carries: the generation it replaces and that generation's records."""

    generation: int
    first_place: int
    num_shards: int
    num_records: int
    num_bytes: int
    classes: tuple[tuple[int, int], ...]


def carry_tasks(m: Manifest, latest: LatestGeneration) -> list[CarryTask]:
    """The latest generation's shards with their index rows (the tail of the split's index, read once, streaming);
    DamagedShard when the rows do not match the shards."""
    split = m.split(latest.split)
    if split.index is None:
        raise DamagedShard(f"split {latest.split!r} has no index")
    wanted = {latest.first_place + i: [] for i in range(len(latest.shards))}
    with storage.open_read(storage.join(m.location, split.index.path)) as f:
        for row in read_index(f, max_rows=split.index.num_rows):
            if row.shard in wanted:
                rows = wanted[row.shard]
                if len(rows) == split.shards[row.shard].num_records:
                    raise DamagedShard(f"{split.index.path}: more rows for shard {row.shard} than its "
                                       f"{len(rows)} records")
                rows.append(row)
    return [CarryTask(latest.split, i, storage.join(m.location, shard.path), shard,
                      tuple(wanted[latest.first_place + i]))
            for i, shard in enumerate(latest.shards)]


def carry_shard(task: CarryTask, folder: str, *, seed: int, label_offset: int = 0,
                extras: Sequence[schema.ExtraSpec] = ()) -> CarriedRun:
    """Copy one shard's records, checked, into a run under folder (the same bytes under the same name when run
    twice); DamagedShard when the shard does not match its manifest entry or index rows."""
    writer = RunWriter(storage.join(folder, CARRY_FOLDER), task.split, task.position)
    classes: Counter = Counter()
    try:
        for meta, framed in shard_records(task.uri, task.shard, task.rows, seed=seed, label_offset=label_offset,
                                            extras=extras):
            writer.add(framed, meta)
            classes.update(meta.labels)
    except BaseException:
        writer.abort()
        raise
    file = writer.close()
    if file is None:
        raise DamagedShard(f"{task.shard.path}: holds no record")
    return CarriedRun(task.split, task.position, file, tuple(sorted(classes.items())))


def carried_of(latest: LatestGeneration, runs: Sequence[CarriedRun]) -> Carried:
    """The totals of a latest generation copied into runs."""
    classes: Counter = Counter()
    for r in runs:
        classes.update(dict(r.classes))
    return Carried(latest.generation, latest.first_place, len(latest.shards), sum(r.file.count for r in runs),
                   sum(r.file.num_bytes for r in runs), tuple(sorted(classes.items())))
