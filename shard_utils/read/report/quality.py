"""What the report shows of quality.jsonl: near-duplicate clusters and label conflicts as rows of a sheet (a pair
side by side, a larger cluster as a contact-sheet row), those that leak across splits first; and the flags of
single images in a table. quality.jsonl is hostile input: lines that are not findings are counted, never trusted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from shard_utils import storage
from shard_utils.format import schema
from shard_utils.format.index import read_index, unframe
from shard_utils.format.manifest import Manifest
from shard_utils.quality import findings
from shard_utils.read.report.sample import SplitSample, Tile

__all__ = ["SHOWN_CLUSTERS", "SHOWN_FLAGS", "QualityFindings", "read_findings", "cluster_sample"]

SHOWN_CLUSTERS = 24  # clusters drawn on the sheet
SHOWN_FLAGS = 100  # flags listed in the table


@dataclass
class QualityFindings:
    """The findings the page shows (clusters in shown order: leaks first, then the largest), how many the file
    holds, its lines that are not findings, and any read problem."""

    clusters: list[dict] = field(default_factory=list)
    flags: list[dict] = field(default_factory=list)
    total: int = 0
    bad_lines: int = 0
    problem: str | None = None


def read_findings(m: Manifest, clusters: int = SHOWN_CLUSTERS, flags: int = SHOWN_FLAGS) -> QualityFindings:
    """Stream quality.jsonl once, keeping the clusters to show (leaks before the rest, larger before smaller) and
    the first flags; memory stays bounded by what is shown."""
    found = QualityFindings()
    name = (m.quality or {}).get("path")
    if not isinstance(name, str):
        return found
    leaking: list[dict] = []
    others: list[dict] = []
    try:
        with storage.open_read(storage.join(m.location, name)) as stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                found.total += 1
                try:
                    made = findings.from_line(line)
                except findings.BadFinding:
                    found.bad_lines += 1
                    continue
                if made["kind"] in findings.CLUSTER_KINDS:
                    kept = leaking if findings.leaks(made) else others
                    kept.append(made)
                    if len(kept) > clusters:  # keep the largest: a cluster of five says more than a pair
                        kept.remove(min(kept, key=_shown_order))
                elif len(found.flags) < flags:
                    found.flags.append(made)
    except storage.StorageError as exc:
        found.problem = str(exc)
    found.clusters = (sorted(leaking, key=_shown_order, reverse=True) + sorted(others, key=_shown_order,
                                                                               reverse=True))[:clusters]
    return found


def _shown_order(made: dict) -> tuple:
    return (len(made["sources"]), made["kind"] == findings.LABEL_CONFLICT, [-ord(c) for c in made["sources"][0]])


def cluster_sample(m: Manifest, clusters: list[dict]) -> SplitSample:
    """The clusters as a sheet's groups: one row each (named by its number, kind and splits), its members' stored
    images, each captioned with its split and source id; members not found in the dataset are left out (a
    `drop` kept one), named in `problems`."""
    wanted = {(split, source) for made in clusters
              for source, split in zip(made["sources"], made["splits"], strict=True)}
    sample = SplitSample("near-duplicates", 0, {}, {})
    try:
        images = _stored_images(m, wanted)
    except (ValueError, storage.StorageError) as exc:  # a damaged index or shard: IndexFormatError, FramingError
        images, sample.problems = {}, [f"the images of the clusters cannot be read: {exc}"]
    for number, made in enumerate(clusters, start=1):
        leak = "leaks across splits: " if findings.leaks(made) else ""
        name = f"{number}. {leak}{made['kind'].replace('_', ' ')} ({', '.join(sorted(set(made['splits'])))})"
        tiles = [Tile(split, "", 0, source, (split,), images[(split, source)], 0)
                 for source, split in zip(made["sources"], made["splits"], strict=True) if (split, source) in images]
        sample.groups[name] = tiles
        sample.class_counts[name] = len(made["sources"])
        sample.problems += [f"{source} ({split}) is not in the dataset" for source, split
                            in zip(made["sources"], made["splits"], strict=True) if (split, source) not in images]
    return sample


def _stored_images(m: Manifest, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
    """The stored JPEG of each wanted (split, source id), found through the split's index (rows are streamed,
    only the wanted records' bytes are read)."""
    out: dict[tuple[str, str], bytes] = {}
    for split_name in sorted({split for split, _ in wanted}):
        split = m.splits.get(split_name)
        if split is None or split.index is None:
            continue
        sources = {source for s, source in wanted if s == split_name}
        with storage.open_read(storage.join(m.location, split.index.path)) as stream:
            rows = [row for row in read_index(stream, split.index.num_rows) if row.source_id in sources]
        for row in rows:
            if not 0 <= row.shard < len(split.shards):
                continue
            framed = storage.read_range(storage.join(m.location, split.shards[row.shard].path), row.offset,
                                        row.length)
            encoded = schema.decode_lists(unframe(framed)).get(schema.IMAGE_ENCODED, [])
            if encoded and isinstance(encoded[0], bytes):
                out[(split_name, row.source_id)] = encoded[0]
    return out
