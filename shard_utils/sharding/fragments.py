"""A reshard's copied records in sorted files ("fragments"), and how shards are cut from them.

A reshard's copy step buffers its records, sorts them by (split, sort key, source id) and writes them as one
fragment file, and their metadata (RecordMeta) beside it in chunks. Because a shard is a contiguous
range of its split's order, every shard takes one contiguous byte range (a slice) from each fragment:
the shard writer (`writer.write_shard`) reads exactly the bytes it writes, in windows, and merges the
sorted slices. A build's runs are such files too, each holding one range of the order, so that its shards
are pieces of runs taken one after another (`runs`).

The metadata travels in files, not in the job's elements: a FragmentInfo holds per-split counts
and where the metadata lies, so what the job's driver holds does not grow with the number of records.
"""
from __future__ import annotations

import heapq
import itertools
import pickle
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.media.encode import Encoded, RecordMeta
from shard_utils.sharding.run_plan import SplitLayout

__all__ = [
    "META_CHUNK", "READ_BUDGET", "MIN_WINDOW", "MetaRange", "Section", "FragmentInfo", "Slice", "write_fragment",
    "FragmentBuffer", "slices", "read_slice", "window_for", "merge"
]

META_CHUNK = 1024  # records per pickled chunk of a metadata file: a slice reads only the chunks it needs
READ_BUDGET = 16 * 2**20  # bytes a shard writer holds of its slices at once, shared by all of them
MIN_WINDOW = 64 * 2**10  # the smallest read of a slice (one ranged GET on gs://)


@dataclass(frozen=True)
class MetaRange:
    """Where the metadata of a run of a fragment's records lies: chunks of its metadata file."""

    path: str
    start: int  # byte offset of the first chunk holding the run
    sizes: tuple[int, ...]  # byte sizes of the chunks from there
    skip: int  # records of the first chunk before the run
    count: int

    def read(self) -> list[RecordMeta]:
        """The run's metadata, in fragment order (one ranged read)."""
        if not self.count:
            return []
        data = storage.read_range(self.path, self.start, sum(self.sizes))
        out: list[RecordMeta] = []
        pos = 0
        for size in self.sizes:
            out.extend(pickle.loads(data[pos:pos + size]))
            pos += size
        if len(out) < self.skip + self.count:
            raise InternalError(f"metadata file {self.path} holds {len(out)} records at {self.start}, "
                                f"expected at least {self.skip + self.count}")
        return out[self.skip:self.skip + self.count]


@dataclass(frozen=True)
class Section:
    """The records of one split inside a fragment, in key order: bytes from `start`, records from `first`."""

    split: str
    start: int
    num_bytes: int
    first: int
    count: int


@dataclass(frozen=True)
class FragmentInfo:
    """A written fragment file, its metadata file, and what it holds per split."""

    path: str
    meta_path: str
    meta_offsets: tuple[int, ...]  # byte offset of each metadata chunk, then the file's size
    sections: tuple[Section, ...]

    def meta_range(self, first: int, count: int) -> MetaRange:
        """Where the metadata of records first..first+count-1 lies."""
        if count <= 0:
            return MetaRange(self.meta_path, 0, (), 0, 0)
        lo, hi = first // META_CHUNK, (first + count - 1) // META_CHUNK
        sizes = tuple(self.meta_offsets[c + 1] - self.meta_offsets[c] for c in range(lo, hi + 1))
        return MetaRange(self.meta_path, self.meta_offsets[lo], sizes, first - lo * META_CHUNK, count)

    def metas(self, section: Section) -> list[RecordMeta]:
        """The section's records' metadata, in key order."""
        return self.meta_range(section.first, section.count).read()


@dataclass(frozen=True)
class Slice:
    """The records of one shard inside one fragment: a contiguous byte range and where their metadata lies."""

    fragment: str
    start: int
    length: int
    metas: MetaRange

    @property
    def count(self) -> int:
        return self.metas.count


def write_fragment(folder: str, name: str, records: Iterable[Encoded]) -> FragmentInfo | None:
    """Write records as one fragment (split, then key order) and their metadata beside it; None when there are none."""
    ordered = sorted(records, key=lambda e: (e.split, e.meta.sort_key, e.meta.source_id))
    if not ordered:
        return None
    path = storage.join(folder, "fragments", name + ".records")
    meta_path = storage.join(folder, "fragment-metas", name + ".meta")
    with storage.open_write(path, durable=False) as out:  # scratch: a rerun writes its own
        for e in ordered:
            out.write(e.framed)
    offsets = [0]
    with storage.open_write(meta_path, durable=False) as out:
        for i in range(0, len(ordered), META_CHUNK):
            data = pickle.dumps([e.meta for e in ordered[i:i + META_CHUNK]], protocol=pickle.HIGHEST_PROTOCOL)
            out.write(data)
            offsets.append(offsets[-1] + len(data))
    sections: list[Section] = []
    offset = 0
    for i, e in enumerate(ordered):
        if not sections or sections[-1].split != e.split:
            sections.append(Section(e.split, offset, 0, i, 0))
        last = sections[-1]
        sections[-1] = Section(last.split, last.start, last.num_bytes + len(e.framed), last.first, last.count + 1)
        offset += len(e.framed)
    return FragmentInfo(path, meta_path, tuple(offsets), tuple(sections))


class FragmentBuffer:
    """Framed records waiting to be written as one sorted fragment, once they reach `limit` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.records: list[Encoded] = []
        self.size = 0

    def add(self, record: Encoded) -> bool:
        """Buffer a record; True when the buffer is full and should be flushed."""
        self.records.append(record)
        self.size += len(record.framed)
        return self.size >= self.limit

    def flush(self, folder: str) -> Iterator[FragmentInfo]:
        """Write the buffered records as one fragment under the run's temporary `folder`; yields its FragmentInfo."""
        info = write_fragment(folder, uuid.uuid4().hex, self.records)
        self.records, self.size = [], 0
        if info is not None:
            yield info


def slices(info: FragmentInfo, layouts: Mapping[str, SplitLayout]) -> Iterator[tuple[tuple[str, int], Slice]]:
    """((split, shard), Slice) for every shard that takes records from this fragment (`layouts`: one run per
    shard, `run_plan.plan_exact_layouts`)."""
    for section in info.sections:
        layout = layouts.get(section.split)
        if layout is None:
            raise InternalError(f"split {section.split!r} has records but no plan")
        metas = info.metas(section)
        offsets = [section.start]
        for m in metas:
            offsets.append(offsets[-1] + m.length)
        owners = [layout.run_of(m.order) for m in metas]  # ascending: the section is in key order
        at = 0
        for shard, members in itertools.groupby(owners):  # the shards this section feeds, not all of the split's
            first = at
            at += sum(1 for _ in members)
            yield (section.split, shard), Slice(info.path, offsets[first], offsets[at] - offsets[first],
                                                info.meta_range(section.first + first, at - first))


def read_slice(piece: Slice, window: int) -> Iterator[tuple[RecordMeta, bytes]]:
    """The framed records of a slice with their metadata, read in ranged reads of about `window` bytes."""
    metas = piece.metas.read()
    if sum(m.length for m in metas) != piece.length:
        raise InternalError(f"fragment {piece.fragment}: the metadata of the slice at {piece.start} does not "
                            f"add up to its {piece.length} bytes")
    buf, pos, at, end = b"", 0, piece.start, piece.start + piece.length
    for meta in metas:
        if pos + meta.length > len(buf):
            need = max(window, meta.length - (len(buf) - pos))
            buf = buf[pos:] + storage.read_range(piece.fragment, at, min(need, end - at))
            at += min(need, end - at)
            pos = 0
        yield meta, buf[pos:pos + meta.length]
        pos += meta.length


def window_for(pieces: int, budget: int = READ_BUDGET) -> int:
    """The read size per slice when a shard merges `pieces` slices at once."""
    return max(MIN_WINDOW, budget // max(1, pieces))


def merge(runs: Iterable[Iterable[tuple[RecordMeta, bytes]]]) -> Iterator[tuple[RecordMeta, bytes]]:
    """Merge sorted runs of records into one run in key order."""
    return heapq.merge(*runs, key=lambda pair: pair[0].order)
