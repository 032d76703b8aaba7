"""Writing one shard from its plan, and its index part: a prefix of a run taken as it is, pieces of runs copied
one after another (a build, an append), or slices of fragments merged in key order (a reshard).

Safe to run twice, or twice at once: a prefix is moved or composed again into the same bytes, a copy is
written whole under the same name. With ArrayRecord asked for, the finished TFRecord shard is read back in
order (nothing decoded) into its ArrayRecord twin, written whole beside it. No Beam: local worker processes
run it too.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.format import index, schema
from shard_utils.format.shard_formats import ARRAY_RECORD, TFRECORD
from shard_utils.media.encode import RecordMeta
from shard_utils.sharding import fragments
from shard_utils.sharding.fragments import Slice
from shard_utils.sharding.runs import Checksums, RunEntry, RunFile, move_prefix, prefix_piece_bytes
from shard_utils.sharding.shards import ShardPlan

__all__ = [
    "COPY_BLOCK", "TwinShard", "ShardResult", "ShardTask", "shard_paths", "write_shard", "write_twin", "describe",
    "read_records"
]

COPY_BLOCK = 8 * 2**20  # bytes of a run read at a time when copying


@dataclass(frozen=True)
class TwinShard:
    """A shard's ArrayRecord twin, written under its temporary name: the same records in the same order."""

    name: str
    temp_path: str
    num_records: int
    num_bytes: int
    crc32c: str
    sha256: str


@dataclass(frozen=True)
class ShardResult:
    """A shard written under its temporary name, and what the manifest and the index need of it."""

    split: str
    index: int
    temp_path: str
    name: str
    num_records: int
    num_bytes: int
    crc32c: str
    sha256: str
    class_counts: tuple[tuple[int, int], ...]  # (label id, records)
    index_part: str = ""  # this shard's index rows: Avro blocks, concatenated per split when publishing
    max_lengths: tuple[tuple[str, int], ...] = ()  # longest list per list feature (labels, extras)
    bytes_copied: int = 0  # of run data read back to write it (0 for a prefix moved locally)
    place: int = -1  # its number among the split's shards (its index rows'); -1: its planned index
    array_record: TwinShard | None = None  # its ArrayRecord twin, when the build writes them

    def __post_init__(self):
        if self.place < 0:
            object.__setattr__(self, "place", self.index)


@dataclass(frozen=True)
class ShardTask:
    """A shard to write: its plan, file name, the runs its pieces come from and their dropped records (a
    reshard's shard names no run: its pieces are slices of fragments)."""

    plan: ShardPlan
    name: str
    place: int  # its number among the split's shards (what its index rows say)
    runs: Mapping[int, RunFile] = field(default_factory=dict)
    dropped: Mapping[int, frozenset[int]] = field(default_factory=dict)  # run -> positions dropped (duplicates)


def shard_paths(folder: str, name: str) -> tuple[str, str]:
    """(temporary shard path, its index part's path) under a run's temporary folder."""
    return storage.join(folder, "shards", name), storage.join(folder, "index", name + ".avro")


def write_shard(task: ShardTask, folder: str, extras: Sequence[schema.ExtraSpec] = (), *,
                array_record_twin: bool = False) -> ShardResult:
    """Write the shard and its index part under `folder` (the build's temporary folder); with
    `array_record_twin`, its ArrayRecord twin too."""
    plan = task.plan
    path, index_part = shard_paths(folder, task.name)
    if plan.slices:
        sums, metas = _write(path, _merged(plan.slices))
        copied = sums.size
    elif plan.prefix:
        piece = plan.pieces[0]
        run = task.runs[piece.run]
        entries = run.entries()
        sums = move_prefix(run, entries, piece.count, path)
        metas = [e.meta for e in entries[:piece.count]]
        copied = prefix_piece_bytes(run, entries, piece.count)
    else:
        sums, metas = _write(path, _copied(task))
        copied = sums.size
    rows, classes, longest = describe(task.place, metas, extras)
    if sum(m.length for m in metas) != sums.size or len(metas) != plan.num_records:
        raise InternalError(f"shard {plan.shard} of split {plan.split!r}: {len(metas)} records in {sums.size} bytes, "
                            f"planned {plan.num_records}")
    storage.write_bytes(index_part, index.index_blocks(rows, index.index_schema(extras)))
    twin = write_twin(path, storage.join(folder, "shards", ARRAY_RECORD.twin_name(task.name)),
                      len(metas)) if array_record_twin else None
    return ShardResult(plan.split, plan.shard, path, task.name, len(metas), sums.size, sums.crc32c, sums.sha256,
                       tuple(sorted(classes.items())), index_part, tuple(sorted(longest.items())), copied,
                       task.place, twin)


def write_twin(shard: str, dst: str, num_records: int) -> TwinShard:
    """The ArrayRecord twin of a finished TFRecord shard: its records read in order, written to dst."""
    written = ARRAY_RECORD.write(TFRECORD.read(shard), dst)
    if written.num_records != num_records:
        raise InternalError(f"{dst}: {written.num_records} records written, the shard holds {num_records}")
    return TwinShard(storage.basename(dst), dst, written.num_records, written.num_bytes, written.crc32c,
                     written.sha256)


def _write(path: str, records: Iterator[tuple[RecordMeta, bytes]]) -> tuple[Checksums, list[RecordMeta]]:
    """Write the records, in order, as the shard at `path`; its checksums and its records' metadata."""
    digest = storage.Digest()
    metas = []
    with storage.open_write(path) as out:
        for meta, data in records:
            out.write(data)
            digest.update(data)
            metas.append(meta)
    return Checksums(digest.size, digest.crc32c, digest.sha256), metas


def _copied(task: ShardTask) -> Iterator[tuple[RecordMeta, bytes]]:
    """The records of the shard's pieces of runs, one piece after another, without its runs' dropped records."""
    entries = {run: task.runs[run].entries() for run in {p.run for p in task.plan.pieces}}
    for piece in task.plan.pieces:
        gone = task.dropped.get(piece.run, frozenset())
        usable = [i for i in range(len(entries[piece.run])) if i not in gone] if gone else None
        positions = usable[piece.first:piece.first + piece.count] if usable is not None else \
            range(piece.first, piece.first + piece.count)
        for entry, data in read_records(task.runs[piece.run], entries[piece.run], positions):
            yield entry.meta, data


def _merged(pieces: Sequence[Slice]) -> Iterator[tuple[RecordMeta, bytes]]:
    """The records of the shard's slices of fragments, merged in key order; each slice read in windows."""
    ordered = sorted(pieces, key=lambda s: (s.fragment, s.start))
    window = fragments.window_for(len(ordered))
    return fragments.merge(fragments.read_slice(piece, window) for piece in ordered)


def read_records(run: RunFile, entries: Sequence[RunEntry],
                 positions: Sequence[int]) -> Iterator[tuple[RunEntry, bytes]]:
    """The records at these positions (ascending), read in blocks of about COPY_BLOCK bytes."""
    if not len(positions):
        return
    wanted = set(positions)
    lo, last = positions[0], positions[-1]
    while lo <= last:
        start = entries[lo - 1].end if lo else 0
        hi = lo
        while hi < last and entries[hi].end - start < COPY_BLOCK:
            hi += 1
        data = run.read(start, entries[hi].end)
        for i in range(lo, hi + 1):
            if i in wanted:
                begin = (entries[i - 1].end if i else 0) - start
                yield entries[i], data[begin:entries[i].end - start]
        lo = hi + 1


def describe(shard: int, metas: Sequence, extras: Sequence[schema.ExtraSpec]) -> tuple[list, Counter, Counter]:
    """A shard's index rows (its records' metadata in order), records per label, and longest list per feature."""
    rows, classes, longest, offset = [], Counter[int](), Counter[str](), 0
    for meta in metas:
        rows.append(index.row_from_meta(shard, offset, meta, extras, multi_label=True))
        offset += meta.length
        classes.update(meta.labels)
        for key in (schema.LABEL, schema.LABEL_TEXT):  # a record holds as many label texts as label ids
            longest[key] = max(longest[key], len(meta.labels) or 1)  # an unlabeled record stores NO_LABEL
        for name, values in meta.extras:
            key = schema.EXTRA_PREFIX + name
            longest[key] = max(longest[key], len(values))
    return rows, classes, longest
