"""What a build publishes, planned once with no side effect: the checks (planning failed? too many rejects?), the
manifest to write, the shards to move and the indexes to write."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from beam_jobs.publish.assembly import build_manifest, in_place_order, quality_section
from beam_jobs.run.config import DatasetSpec
from beam_jobs.run.failure import failed
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.reports import Report, as_report
from beam_jobs.run.tally import Tally
from shard_utils.errors import InternalError
from shard_utils.format import index, schema
from shard_utils.format.filenames import QUALITY_NAME
from shard_utils.format.manifest import REJECTED_NAME, SKIPPED_NAME, IndexFile, Manifest
from shard_utils.format.shard_formats import ARRAY_RECORD, TFRECORD
from shard_utils.sharding.writer import ShardResult

__all__ = ["Move", "IndexJob", "Publication", "plan_publication", "shard_moves"]


@dataclass(frozen=True)
class Move:
    """A shard written under the run's temporary folder, and its name in the output."""

    temp: str
    name: str
    size: int


@dataclass(frozen=True)
class IndexJob:
    """A split's index to write: `name` in the output, from the new shards' index parts (Avro blocks, in the
    order of the shards' places), after `base` (an append: the split's index so far) when given, or after
    its first `base_rows` rows (an append that replaces the split's latest generation)."""

    split: str
    name: str
    parts: tuple[str, ...]
    rows: int
    extras: tuple[schema.ExtraSpec, ...] = ()
    base: IndexFile | None = None
    base_rows: int | None = None


@dataclass(frozen=True)
class Publication:
    """What publishing does: the manifest (its splits' index entries filled in by `commit`), the moves, the
    indexes, the reports (name in the output, what it holds); `grows` is the manifest an append grows (None: a
    build replaces the dataset)."""

    run: RunInfo
    manifest: Manifest
    moves: tuple[Move, ...]
    indexes: tuple[IndexJob, ...]
    reports: tuple[tuple[str, Report], ...]
    grows: Manifest | None = None

    @property
    def new_names(self) -> frozenset[str]:
        return frozenset([m.name for m in self.moves] + [j.name for j in self.indexes] + [n for n, _ in self.reports])


def plan_publication(results: Sequence[ShardResult], config: DatasetSpec, *, plans: Sequence[Mapping],
                     failure: Sequence[str],
                     rejected: Report | Sequence[dict], skipped_files: Report | Sequence[dict], tally: Tally,
                     labels: Sequence[str], run: RunInfo, cross_split: Sequence[str] = (),
                     known_labels: Sequence[str] = (), adjust: Callable[[Manifest], Manifest] | None = None,
                     quality: Report | Sequence[dict] | None = None) -> Publication:
    """What a build publishes; PlanError (its reports left in the run's temporary folder) when planning failed
    or more files were rejected than allowed. The reports come as their counts and pieces (`reports.Report`) or
    as entries; `quality` (the findings of the quality checks; None: a job that ran none, e.g. a reshard) is
    published when the build ran them. `known_labels`
    keep their ids; `adjust` changes the manifest (a reshard carries the source's
    fields over). No side effect but the reports of a failure."""
    rejected, skipped_files = as_report(rejected), as_report(skipped_files)
    if failure:
        raise failed(failure[0], run.temp_dir, rejected, skipped_files, tally)
    stills = tally.skipped.get("still_image", 0)
    if config.video is not None and stills:
        raise failed(f"a dataset holds video clips or still images, not both: this video build (--video-frames) "
                     f"found {stills} still images; build them into another output without --video-frames",
                     run.temp_dir, rejected, skipped_files, tally)
    manifest = build_manifest(config, run, results, plans[0], rejected.counts.by_reason, tally, labels,
                              bool(len(skipped_files)), known_labels)
    if adjust is not None:
        manifest = adjust(manifest)
    if config.dedup:
        manifest.duplicates = {"count": rejected.counts.by_reason.get("duplicate", 0),
                               "cross_split": dict(sorted(Counter(cross_split).items()))}
    if config.max_rejected.exceeded(len(rejected), tally.seen):
        raise failed(f"{len(rejected)} of {tally.seen} files were rejected, more than --max-rejected "
                     f"{config.max_rejected} allows; nothing was published", run.temp_dir, rejected, skipped_files,
                     tally)
    moves = shard_moves(results, config.formats)
    extras = tuple(config.listing.extras)
    indexes = tuple(IndexJob(name, index.index_name(name), tuple(r.index_part for r in in_place_order(results, name)),
                             split.num_records, extras) for name, split in manifest.splits.items()
                    if TFRECORD.name in config.formats)
    reports = [(REJECTED_NAME, rejected)]
    if len(skipped_files):
        reports.append((SKIPPED_NAME, skipped_files))
    if quality is not None and config.quality_checks:
        quality = as_report(quality)
        manifest.quality = quality_section(quality.counts.by_reason, QUALITY_NAME)
        reports.append((QUALITY_NAME, quality))
    return Publication(run, manifest, moves, indexes, tuple(reports))


def shard_moves(results: Sequence[ShardResult], formats: Sequence[str]) -> tuple[Move, ...]:
    """The shards to move into the output: TFRecord shards, ArrayRecord twins, or both. Without TFRecord, the
    TFRecord shards stay in the run's temporary folder (what the twins were written from) and go with it."""
    moves = []
    for r in sorted(results, key=lambda r: r.name):
        if TFRECORD.name in formats:
            moves.append(Move(r.temp_path, r.name, r.num_bytes))
        if ARRAY_RECORD.name in formats:
            if r.array_record is None:
                raise InternalError(f"shard {r.name} has no ArrayRecord twin")
            moves.append(Move(r.array_record.temp_path, r.array_record.name, r.array_record.num_bytes))
    return tuple(moves)
