"""Sorted runs of framed records ("fragments") and how shards are cut from them. Pure functions.

An encoder buffers its records, sorts them by (split, sort key, source id) and writes them as one
fragment file. Because a shard is a contiguous range of its split's order, every shard takes one
contiguous byte range (a slice) from each fragment: shard writers read exactly the bytes they
write, one ranged read per fragment, and merge the sorted slices.
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Container, Iterable, Iterator, Mapping, Sequence

from .encode import Encoded, RecordMeta
from .plan import InternalError, SplitPlan


@dataclass(frozen=True)
class Section:
    """The records of one split inside a fragment, in key order, starting at byte `start`."""

    split: str
    start: int
    metas: tuple[RecordMeta, ...]

    @property
    def num_bytes(self) -> int:
        return sum(m.length for m in self.metas)


@dataclass(frozen=True)
class FragmentInfo:
    """A written fragment file and what it holds, per split."""

    path: str
    sections: tuple[Section, ...]


@dataclass(frozen=True)
class Slice:
    """The records of one shard inside one fragment: a contiguous byte range and their metadata."""

    fragment: str
    start: int
    length: int
    metas: tuple[RecordMeta, ...]


def layout(records: Iterable[Encoded]) -> tuple[list[bytes], list[tuple[str, list[RecordMeta]]]]:
    """Order records for a fragment: by split, then key. Returns the framed bytes in order and the sections."""
    ordered = sorted(records, key=lambda e: (e.split, e.meta.sort_key, e.meta.source_id))
    sections: list[tuple[str, list[RecordMeta]]] = []
    for e in ordered:
        if not sections or sections[-1][0] != e.split:
            sections.append((e.split, []))
        sections[-1][1].append(e.meta)
    return [e.framed for e in ordered], sections


def fragment_info(path: str, sections: Sequence[tuple[str, Sequence[RecordMeta]]]) -> FragmentInfo:
    """The FragmentInfo of a fragment written in `layout` order."""
    out, offset = [], 0
    for split, metas in sections:
        out.append(Section(split, offset, tuple(metas)))
        offset += sum(m.length for m in metas)
    return FragmentInfo(path, tuple(out))


def slices(info: FragmentInfo, plans: Mapping[str, SplitPlan],
           dropped: Container[str] = frozenset()) -> Iterator[tuple[tuple[str, int], Slice]]:
    """((split, shard), Slice) for every shard that takes records from this fragment.

    Records whose source id is in `dropped` (duplicates) belong to no shard; one lying between two
    records of the same shard stays inside that shard's byte range and the writer skips it.
    """
    for section in info.sections:
        split_plan = plans[section.split]
        if split_plan.boundaries is None:
            raise InternalError(f"split {section.split!r}: shard boundaries are not known yet")
        offsets = [section.start]
        for m in section.metas:
            offsets.append(offsets[-1] + m.length)
        kept = [i for i, m in enumerate(section.metas) if m.source_id not in dropped]
        keys = [section.metas[i].order for i in kept]
        cuts = [0] + [bisect.bisect_left(keys, b) for b in split_plan.boundaries] + [len(keys)]
        for shard in range(split_plan.num_shards):
            lo, hi = cuts[shard], cuts[shard + 1]
            if hi > lo:
                first, last = kept[lo], kept[hi - 1]
                yield (section.split, shard), Slice(info.path, offsets[first], offsets[last + 1] - offsets[first],
                                                    section.metas[first:last + 1])


def split_slice(piece: Slice, data: bytes) -> list[tuple[RecordMeta, bytes]]:
    """The framed records of a slice's bytes, paired with their metadata."""
    if len(data) != piece.length:
        raise InternalError(f"fragment {piece.fragment}: read {len(data)} bytes at {piece.start}, "
                            f"expected {piece.length}")
    out, pos = [], 0
    for meta in piece.metas:
        out.append((meta, data[pos:pos + meta.length]))
        pos += meta.length
    return out


def merge(runs: Iterable[list[tuple[RecordMeta, bytes]]]) -> Iterator[tuple[RecordMeta, bytes]]:
    """Merge sorted runs of records into one run in key order."""
    return heapq.merge(*runs, key=lambda pair: pair[0].order)
