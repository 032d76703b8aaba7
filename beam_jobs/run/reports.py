"""The per-file reports (`rejected.jsonl`, `skipped.jsonl`, `quality.jsonl`) without holding their lines in one place.

A report's lines are sorted by source (a quality finding's first source). The job counts them (bounded: by reason,
an example per reason, and a sample of sort keys), cuts the key space into ranges from the sample, writes each
range as a sorted piece in parallel, and composes the pieces in range order into the report: the bytes of one sort,
whatever the ranges.
Only the counts and the pieces' names reach the one step that publishes. Each piece has a name fixed by its
range, so a retry rewrites the same bytes.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from shard_utils import storage

__all__ = [
    "PIECE_LINES", "MAX_PIECES", "PIECES_FOLDER", "SAMPLE_KEYS", "Key", "batch_of", "line_of", "sort_key",
    "ReportCounts", "counted", "piece_of", "piece_bytes", "piece_path", "write_piece", "Report", "as_report",
    "write_report"
]

PIECE_LINES = 20_000  # lines per piece, about: what one worker sorts at once
MAX_PIECES = 1_000
PIECES_FOLDER = "report-pieces"  # in a run's temporary folder, beside `report/` (what a failed build leaves)
SAMPLE_KEYS = 4_096  # sort keys kept to cut the ranges (those of the smallest hashes: the same for any bundling)

Key = tuple[str, str]  # (source, reason): the order of a report's lines (then the line itself), and their ranges


def batch_of(entries: Mapping | Sequence[Mapping]) -> tuple[Mapping, ...]:
    """A report's element as the entries it holds: one entry, or a tuple of them (a run's quality flags)."""
    return (entries,) if isinstance(entries, Mapping) else tuple(entries)


def line_of(entry: Mapping) -> str:
    return json.dumps(entry, ensure_ascii=False)


def sort_key(entry: Mapping) -> Key:
    """(source, reason) of a rejected or skipped file; (first source, kind) of a quality finding."""
    if "kind" in entry:
        return entry["sources"][0], entry["kind"]
    return entry["source"], entry["reason"]


def _hashed(key: Key) -> bytes:
    return hashlib.blake2b(f"{key[0]}\0{key[1]}".encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _before(entry: Mapping, key: Key, other: tuple[Key, dict]) -> bool:
    """Whether entry comes before `other` (key, entry) in a report."""
    return key < other[0] or (key == other[0] and line_of(entry) < line_of(other[1]))


@dataclass
class ReportCounts:
    """What a report says in brief, bounded whatever its length: its lines by reason, the first entry (by
    source) of each reason, and `sample`, the sort keys of the lines with the smallest hashes. Mergeable."""

    count: int = 0
    by_reason: Counter = field(default_factory=Counter)
    examples: dict[str, tuple[Key, dict]] = field(default_factory=dict)
    sample: list[tuple[bytes, Key]] = field(default_factory=list)

    def add(self, entry: Mapping) -> ReportCounts:
        key = sort_key(entry)
        reason = key[1]
        self.count += 1
        self.by_reason[reason] += 1
        first = self.examples.get(reason)
        if first is None or _before(entry, key, first):
            self.examples[reason] = key, dict(entry)
        self.sample.append((_hashed(key), key))
        return self.trimmed() if len(self.sample) >= 2 * SAMPLE_KEYS else self

    def trimmed(self) -> ReportCounts:
        """The same, its sample cut to the SAMPLE_KEYS smallest hashes (what any merge would keep)."""
        self.sample = sorted(set(self.sample))[:SAMPLE_KEYS]
        return self

    def merge(self, other: ReportCounts) -> ReportCounts:
        self.count += other.count
        self.by_reason.update(other.by_reason)
        for reason, example in other.examples.items():
            first = self.examples.get(reason)
            if first is None or _before(example[1], example[0], first):
                self.examples[reason] = example
        self.sample += other.sample
        return self.trimmed()

    def bounds(self, piece_lines: int = PIECE_LINES) -> tuple[Key, ...]:
        """Where pieces start (the first piece from the lowest key): quantiles of the sample, about
        `piece_lines` lines apart."""
        pieces = min(MAX_PIECES, math.ceil(self.count / piece_lines))
        keys = sorted(key for _, key in sorted(set(self.sample))[:SAMPLE_KEYS])
        if pieces <= 1 or not keys:
            return ()
        return tuple(sorted({keys[len(keys) * i // pieces] for i in range(1, pieces)}))

    def example(self, reason: str) -> dict:
        """The entry of that reason with the smallest source."""
        return self.examples[reason][1]

    def brief(self) -> ReportCounts:
        """Without the sample: what publishing needs."""
        return replace(self, sample=[])


def counted(entries: Iterable[Mapping]) -> ReportCounts:
    counts = ReportCounts()
    for entry in entries:
        counts.add(entry)
    return counts


def piece_of(entry: Mapping, bounds: Sequence[Key]) -> int:
    return bisect.bisect_right(bounds, sort_key(entry))


def piece_bytes(entries: Iterable[Mapping]) -> bytes:
    """Entries as report lines, sorted by source (then reason, then the line)."""
    lines = sorted((*sort_key(e), line_of(e)) for e in entries)
    return "".join(line + "\n" for _, _, line in lines).encode("utf-8")


def piece_path(folder: str, report: str, piece: int) -> str:
    return storage.join(folder, PIECES_FOLDER, report, f"{piece:05d}.jsonl")


def write_piece(folder: str, report: str, piece: int, entries: Iterable[Mapping]) -> str:
    """One piece of a report, sorted, under a run's temporary folder; its path. A retry writes the same bytes."""
    path = piece_path(folder, report, piece)
    storage.write_bytes(path, piece_bytes(entries))
    return path


@dataclass(frozen=True)
class Report:
    """A report to publish: its counts, and its lines as sorted pieces in range order (what the job wrote) or
    as entries held here (a small report made in one process). `before`: a report whose lines come first
    (an append's earlier generations)."""

    counts: ReportCounts
    pieces: tuple[str, ...] = ()
    entries: tuple[Mapping, ...] | None = None
    before: str | None = None

    def __len__(self) -> int:
        return self.counts.count


def as_report(value: Report | Iterable[Mapping]) -> Report:
    """A Report from itself, or from entries held in memory."""
    if isinstance(value, Report):
        return value
    entries = tuple(value)
    return Report(counted(entries).brief(), entries=entries)


def write_report(report: Report, dst: str, scratch: str) -> None:
    """Write a report's lines into dst, composed from its parts without reading them here (on gs://, dst and
    `scratch` in the bucket of the pieces). Safe to repeat: the same parts give the same bytes."""
    name = storage.basename(dst)
    sources = []
    if report.before and storage.exists(report.before):
        copied = storage.join(scratch, f"{name}.before")
        storage.copy(report.before, copied)
        sources.append(copied)
        size = storage.size(copied)
        if size and storage.read_range(copied, size - 1, 1) != b"\n":
            sources.append(storage.join(scratch, f"{name}.newline"))
            storage.write_bytes(sources[-1], b"\n")
    if report.entries is not None:
        sources.append(storage.join(scratch, f"{name}.entries"))
        storage.write_bytes(sources[-1], piece_bytes(report.entries))
    sources += report.pieces
    if sources:
        storage.compose(sources, dst)
    else:
        storage.write_bytes(dst, b"")
