"""Finishing an append without Beam: check the new generation and plan its publication, which grows the
manifest without touching anything the current manifest names.

Until the new manifest replaces the old one (an atomic write), the old manifest and every file it names
stay exactly as they are, so a reader, or a crash at any moment, sees the previous complete dataset. New
shards, the new index and the new reports get names no earlier generation used; files only the old
manifest names are deleted after the new manifest is in place (`publish.commit`).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from beam_jobs.publish.assembly import in_place_order, named_files, quality_section, twin_entry
from beam_jobs.publish.plan import IndexJob, Move, Publication, shard_moves
from beam_jobs.run.claim import is_dataset_file, let_go
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.failure import failed
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.reports import Report, as_report, batch_of
from beam_jobs.run.tally import Tally
from shard_utils import storage
from shard_utils.errors import InternalError, PlanError
from shard_utils.format import filenames, generations, schema, shard_formats
from shard_utils.format.filenames import QUALITY_NAME
from shard_utils.format.manifest import (
    REJECTED_NAME,
    SKIPPED_NAME,
    Generation,
    Manifest,
    Shard,
    Split,
)
from shard_utils.sharding.carry import Carried
from shard_utils.sharding.naming import ShardNaming
from shard_utils.sharding.writer import ShardResult

__all__ = ["append_naming", "plan_append", "grow", "with_generation", "batch_with_generation"]


def append_naming(old: Manifest, config: BuildConfig) -> ShardNaming:
    """Names and places of the new generation's shards: after each split's shards, rotated so hosts stay balanced."""
    unit = config.num_cores * config.num_hosts
    base = {name: (len(split.shards), generations.host_offset([s.num_records for s in split.shards], unit))
            for name, split in old.splits.items()}
    return ShardNaming(config.shard_extension, generations.next_generation(old), base)


def plan_append(results: Sequence[ShardResult], config: BuildConfig, *, plans: list[dict], failure: list[str],
                rejected: Report | Sequence[dict], skipped_files: Report | Sequence[dict], tally: Tally,
                labels: list[str], run: RunInfo, cross_split: Sequence[str] = (), present: Sequence[int] = (),
                encoded: Sequence[int] = (), old: Manifest,
                quality: Report | Sequence[dict] | None = None) -> Publication | None:
    """The new generation's publication; None when nothing is new (the run then lets go of the output); or
    PlanError saying why nothing can be appended. Report entries carry their generation (`with_generation`)."""
    rejected, skipped_files = as_report(rejected), as_report(skipped_files)
    counts: Counter[str] = Counter()
    for r in results:
        counts[r.split] += r.num_records
    unknown = sorted(set(counts) - set(old.splits))
    if unknown:
        raise PlanError(f"split {unknown[0]!r} is not in the dataset (it has {', '.join(old.splits)}); an append adds "
                        "records to the dataset's splits; nothing was written")
    if labels and not old.labels:
        shown = ", ".join(repr(x) for x in sorted(labels)[:5]) + (" ..." if len(labels) > 5 else "")
        raise PlanError(f"this dataset is unlabeled, and the new media have labels ({shown}): a split holds labeled "
                        "or unlabeled records, not both; build them into another output; nothing was written")
    nothing_new = set(rejected.counts.by_reason) <= {"duplicate"} and len(rejected) + sum(
        tally.skipped.values()) == tally.seen  # every new file was a copy of a record (or there were none)
    if not sum(counts.values()) and nothing_new:
        _give_up(config, run, old)  # the dataset stays as it is
        return None
    if not sum(encoded):
        raise failed("nothing to append: none of the new files could be used; nothing was written", run.temp_dir,
                     rejected, skipped_files, tally)
    if failure:
        raise failed(f"{failure[0]}; nothing was written", run.temp_dir, rejected, skipped_files, tally)
    if config.max_rejected.exceeded(len(rejected), tally.seen):
        raise failed(f"{len(rejected)} of {tally.seen} new files were rejected, more than --max-rejected "
                     f"{config.max_rejected} allows; nothing was published", run.temp_dir, rejected, skipped_files,
                     tally)
    return grow(config, run, old, results, plans[0], rejected, skipped_files, tally, labels, cross_split, sum(present),
                None if quality is None else as_report(quality))


def _give_up(config: BuildConfig, run: RunInfo, old: Manifest) -> None:
    """Leave the dataset as it is: this run's temporary data, and the files an interrupted earlier append left
    that the manifest does not name, removed; the lock given back."""
    keep = named_files(old)
    for name in storage.list_names(config.output):
        if is_dataset_file(name) and name not in keep:
            storage.delete(storage.join(config.output, name))
    let_go(config.output, config.temp_root, run)


# ---------------------------------------------------------------------------------------------- the new manifest


def grow(config: BuildConfig, run: RunInfo, old: Manifest, results: Sequence[ShardResult], plans: dict,
         rejected: Report, skipped_files: Report, tally: Tally, labels: Sequence[str],
         cross_split: Sequence[str], present: int, quality: Report | None = None) -> Publication:
    """The publication of the manifest with the new generation added: its shards' moves, each grown split's
    index (the old one, then the new shards' rows) and the cumulative reports."""
    g = generations.next_generation(old)
    names = generations.label_order(labels, old.labels)
    first = shard_formats.get(config.formats[0])  # what `shards` are: TFRecord when published
    tfrecord = shard_formats.TFRECORD.name in config.formats
    moves: list[Move] = []
    splits, indexes, gen_records, gen_shards, gen_carried = {}, [], {}, {}, {}
    for split_name, split in old.splits.items():
        mine = in_place_order(results, split_name)
        if not mine:
            splits[split_name] = split
            continue
        count = plans[split_name].num_shards
        if sorted(r.index for r in mine) != list(range(count)):
            raise InternalError(f"split {split_name!r}: expected {count} new shards, got {len(mine)}")
        if split.index is None and tfrecord:
            raise InternalError(f"split {split_name!r} has no index to grow")
        carried = plans[split_name].carried
        splits[split_name] = _grown_split(g, split, mine, names, config.formats, carried)
        kept = len(split.shards) if carried is None else carried.first_place
        moves += shard_moves(mine, config.formats)
        if tfrecord:
            indexes.append(IndexJob(split_name, filenames.index_name(split_name, g), tuple(r.index_part for r in mine),
                                    sum(r.num_records for r in mine), tuple(config.listing.extras), split.index,
                                    None if carried is None else sum(s.num_records for s in split.shards[:kept])))
        gen_records[split_name] = sum(r.num_records for r in mine) - (carried.num_records if carried else 0)
        gen_shards[split_name] = count
        if carried is not None:
            gen_carried[split_name] = carried.num_records
    skipped_count = sum(tally.skipped.values())
    if tally.seen != sum(gen_records.values()) + len(rejected) + skipped_count:
        raise InternalError(f"accounting does not close: {tally.seen} new files seen, {sum(gen_records.values())} "
                            f"written, {len(rejected)} rejected, {skipped_count} skipped")
    generation = Generation(
        generation=g, created=run.created, input=config.input or "", files_seen=tally.seen, num_records=gen_records,
        num_shards=gen_shards, rejected=len(rejected), skipped=skipped_count, already_in_dataset=present,
        labels_added=names[len(old.labels):], tool_version=config.tool_version, carried=gen_carried)
    reports = {}
    rejected_part = _grown_part(old.rejected, rejected.counts.by_reason, len(rejected))
    if len(rejected):
        rejected_part["path"] = filenames.report_name(REJECTED_NAME, g)
        reports[rejected_part["path"]] = _cumulative(old, old.rejected.get("path"), rejected, g)
    skipped_part = _grown_part(old.skipped, tally.skipped, skipped_count)
    if tally.extensions:
        skipped_part["by_extension"] = _added(old.skipped.get("by_extension", {}), tally.extensions)
    if len(skipped_files):
        skipped_part["path"] = filenames.report_name(SKIPPED_NAME, g)
        reports[skipped_part["path"]] = _cumulative(old, old.skipped.get("path"), skipped_files, g)
    quality_part = old.quality
    if config.quality_checks and quality is not None:  # the old findings, then this generation's
        before = old.quality or {}
        quality_part = quality_section(_added(before.get("by_kind", {}), quality.counts.by_reason),
                                       filenames.report_name(QUALITY_NAME, g))
        reports[quality_part["path"]] = _cumulative(old, before.get("path"), quality, g)
    new = dataclasses.replace(
        old, splits=splits, labels=names, features=_features(old, results, config), created=run.created,
        tool_version=config.tool_version, files_seen=old.files_seen + tally.seen, rejected=rejected_part,
        skipped=skipped_part, duplicates=_duplicates(old, config, rejected, cross_split), quality=quality_part,
        generations=generations.generations_of(old) + [generation],
        format_version=first.manifest_version,
        location=config.output)
    return Publication(run, new, tuple(moves), tuple(indexes), tuple(sorted(reports.items())), grows=old)


def _grown_split(g: int, split: Split, mine: Sequence[ShardResult], labels: Sequence[str],
                 formats: Sequence[str], carried: Carried | None = None) -> Split:
    """The split with generation g's shards (and their ArrayRecord twins) after its own, in their places, in place
    of its latest generation's when they carry its records; its index is written when publishing."""
    tfrecords = [Shard(r.name, r.num_records, r.num_bytes, r.crc32c, r.sha256, g) for r in mine]
    twins = [dataclasses.replace(twin_entry(r), generation=g) for r in mine] \
        if shard_formats.ARRAY_RECORD.name in formats else None
    shards = tfrecords if shard_formats.TFRECORD.name in formats else twins or []
    classes: Counter = Counter()
    for r in mine:
        classes.update(dict(r.class_counts))
    kept, counts = list(split.shards), dict(split.class_counts)
    if carried is not None:
        replaced = kept[carried.first_place:]
        if (len(replaced), sum(s.num_records for s in replaced)) != (carried.num_shards, carried.num_records):
            raise InternalError(f"the carried generation {carried.generation} is not the split's latest shards")
        kept = kept[:carried.first_place]
        for i, n in carried.classes:
            counts[labels[i]] = counts.get(labels[i], 0) - n
        if any(n < 0 for n in counts.values()):
            raise InternalError("class counts of the carried records exceed the split's")
    new_counts = {labels[i]: n for i, n in classes.items()}
    kept_twins = list(split.array_record_shards or [])[:len(kept)]
    all_twins = kept_twins + twins if twins is not None and shards is tfrecords else None
    num_records = sum(s.num_records for s in kept) + sum(r.num_records for r in mine)
    return Split(num_records=num_records, num_bytes=sum(s.num_bytes for s in kept) + sum(s.num_bytes for s in shards),
                 class_counts=generations.merged_counts(counts, new_counts, labels),
                 shards=kept + shards, index=None, array_record_shards=all_twins,
                 unlabeled=0 if labels else num_records)


def _grown_part(part: dict, new_reasons: Counter, new_count: int) -> dict:
    grown = dict(part)
    grown["count"] = int(part.get("count", 0)) + new_count
    grown["by_reason"] = _added(part.get("by_reason", {}), new_reasons)
    return grown


def _added(old: dict, new: Counter) -> dict:
    total = Counter(old)
    total.update(new)
    return dict(sorted((k, v) for k, v in total.items() if v))


def _cumulative(old: Manifest, old_path: str | None, report: Report, g: int) -> Report:
    """The old report's lines as they are, then this generation's (sorted, each with its generation)."""
    if report.entries is not None:
        report = dataclasses.replace(report, entries=tuple(with_generation(e, g) for e in report.entries))
    return dataclasses.replace(report, before=storage.join(old.location, old_path) if old_path else None)


def with_generation(entry: Mapping, g: int) -> dict:
    """A report entry of generation g."""
    return {**entry, "generation": g}


def batch_with_generation(entries: Mapping | Sequence[Mapping], g: int) -> tuple[dict, ...]:
    """A report element (one entry or a tuple of them: a run's quality flags) as entries of generation g."""
    return tuple(with_generation(e, g) for e in batch_of(entries))


def _features(old: Manifest, results: Sequence[ShardResult], config: BuildConfig) -> dict:
    longest: Counter = Counter()
    for r in results:
        for key, n in r.max_lengths:
            longest[key] = max(longest[key], n)
    if not old.multi_label and longest[schema.LABEL] > 1:
        raise PlanError("the new files carry several labels each, but the dataset is single-label; nothing was "
                        "written (rebuild it as a multi-label dataset)")
    new = schema.feature_table(multi_label=old.multi_label, extras=config.listing.extras, max_lengths=longest)
    try:
        return generations.merged_features(old.features, new)
    except ValueError as exc:
        raise PlanError(f"{exc}; an append must use the options of the first build; nothing was written") from None


def _duplicates(old: Manifest, config: BuildConfig, rejected: Report, cross_split: Sequence[str]):
    if not config.dedup and old.duplicates is None:
        return None
    before = old.duplicates or {}
    return {"count": int(before.get("count", 0)) + rejected.counts.by_reason.get("duplicate", 0),
            "cross_split": _added(before.get("cross_split", {}), Counter(cross_split))}
