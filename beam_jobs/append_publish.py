"""Finishing an append without Beam: check the new generation, grow the manifest, publish without touching
anything the current manifest names.

Until the new manifest replaces the old one (an atomic write), the old manifest and every file it names
stay exactly as they are, so a reader, or a crash at any moment, sees the previous complete dataset. New
shards, the new index and the new reports get names no earlier generation used; files only the old
manifest names are deleted after the new manifest is in place.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Sequence

from shard_utils import generations, index, manifest, runlock, schema, storage
from shard_utils.manifest import MANIFEST_NAME, REJECTED_NAME, SKIPPED_NAME, Generation, Manifest, Shard, Split
from shard_utils.plan import InternalError, PlanError

from .config import BuildConfig, RunInfo
from .errors import UsageError
from .publish import (_INDEX_FILE, _SHARD_FILE, ShardResult, Tally, _jsonl, crash_point, failure_message,
                      remove_run_folder, tfds_files, write_reports)


@dataclasses.dataclass(frozen=True)
class Grown:
    """What publishing an append moves and writes: the new manifest, (temp, final name, size) moves, reports."""

    manifest: Manifest
    moves: tuple[tuple[str, str, int], ...]
    reports: dict[str, bytes]


def finish_append(results: list[ShardResult], config: BuildConfig, *, plans: list[dict], failure: list[str],
                  rejected: list[dict], skipped_files: list[dict], tally: Tally, labels: list[str], run: RunInfo,
                  cross_split: Sequence[str] = (), present: Sequence[int] = (),
                  new_records: Sequence[tuple[str, int]] = (), old: Manifest) -> str:
    """Publish the new generation, do nothing when nothing is new, or fail with one line saying why."""
    report = storage.join(run.temp_dir, "report")
    counts = dict(new_records)
    unknown = sorted(set(counts) - set(old.splits))
    if unknown:
        raise PlanError(f"split {unknown[0]!r} is not in the dataset (it has {', '.join(old.splits)}); an append adds "
                        "records to the dataset's splits; nothing was written")
    if not sum(counts.values()):
        if all(r["reason"] == "duplicate" for r in rejected):
            _give_up(config, run)  # nothing new: the dataset stays as it is
            return ""
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message("nothing to append: none of the new files could be used; nothing was written",
                                        rejected, tally, report))
    unit = config.num_cores * config.num_hosts
    small = sorted((name, n) for name, n in counts.items() if 0 < n < unit)
    if small:
        name, n = small[0]
        raise PlanError(f"split {name!r}: {n} new records cannot fill the {unit} shards (num_cores x num_hosts) of a "
                        f"new generation without empty ones; nothing was written (append when there are at least "
                        f"{unit} new files for it)")
    if failure:
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(failure[0], rejected, tally, report))
    if config.max_rejected.exceeded(len(rejected), tally.seen):
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(
            f"{len(rejected)} of {tally.seen} new files were rejected, more than --max-rejected {config.max_rejected} "
            "allows; nothing was published", rejected, tally, report))
    grown = grow(config, run, old, results, plans[0], rejected, skipped_files, tally, labels, cross_split, sum(present))
    return publish_generation(config, run, old, grown)


def _give_up(config: BuildConfig, run: RunInfo) -> None:
    remove_run_folder(config.temp_root, run.temp_dir)
    runlock.release(config.output, run.run_id)


# ---------------------------------------------------------------------------------------------- the new manifest


def grow(config: BuildConfig, run: RunInfo, old: Manifest, results: Sequence[ShardResult], plans: dict,
         rejected: Sequence[dict], skipped_files: Sequence[dict], tally: Tally, labels: Sequence[str],
         cross_split: Sequence[str], present: int) -> Grown:
    """The manifest with the new generation added, the new shards' moves and the cumulative reports."""
    g = generations.next_generation(old)
    names = generations.label_order(labels, old.labels)
    splits, moves, gen_records, gen_shards = {}, [], {}, {}
    for split_name, split in old.splits.items():
        mine = sorted((r for r in results if r.split == split_name), key=lambda r: r.index)
        if not mine:
            splits[split_name] = split
            continue
        count = plans[split_name].num_shards
        if [r.index for r in mine] != list(range(count)):
            raise InternalError(f"split {split_name!r}: expected {count} new shards, got {len(mine)}")
        splits[split_name], placed = _grown_split(config, run, g, split_name, split, mine, names)
        moves += placed
        gen_records[split_name], gen_shards[split_name] = sum(r.num_records for r in mine), count
    skipped_count = sum(tally.skipped.values())
    if tally.seen != sum(gen_records.values()) + len(rejected) + skipped_count:
        raise InternalError(f"accounting does not close: {tally.seen} new files seen, {sum(gen_records.values())} "
                            f"written, {len(rejected)} rejected, {skipped_count} skipped")
    generation = Generation(
        generation=g, created=run.created, input=config.input or "", files_seen=tally.seen, num_records=gen_records,
        num_shards=gen_shards, rejected=len(rejected), skipped=skipped_count, already_in_dataset=present,
        labels_added=names[len(old.labels):], tool_version=config.tool_version)
    reports = {}
    rejected_part = _grown_part(old.rejected, Counter(r["reason"] for r in rejected), len(rejected))
    if rejected:
        rejected_part["path"] = generations.report_name(REJECTED_NAME, g)
        reports[rejected_part["path"]] = _cumulative(old, old.rejected.get("path"), rejected, g)
    skipped_part = _grown_part(old.skipped, tally.skipped, skipped_count)
    if tally.extensions:
        skipped_part["by_extension"] = _added(old.skipped.get("by_extension", {}), tally.extensions)
    if skipped_files:
        skipped_part["path"] = generations.report_name(SKIPPED_NAME, g)
        reports[skipped_part["path"]] = _cumulative(old, old.skipped.get("path"), skipped_files, g)
    new = dataclasses.replace(
        old, splits=splits, labels=names, features=_features(old, results, config), created=run.created,
        tool_version=config.tool_version, files_seen=old.files_seen + tally.seen, rejected=rejected_part,
        skipped=skipped_part, duplicates=_duplicates(old, config, rejected, cross_split),
        generations=generations.generations_of(old) + [generation], format_version=manifest.FORMAT_VERSION,
        location=config.output)
    try:
        manifest.parse(new.to_json(), config.output)  # the loader's own checks, before anything is published
    except manifest.ManifestError as exc:
        raise InternalError(f"the grown manifest does not validate: {exc}") from None
    return Grown(new, tuple(moves), reports)


def _grown_split(config: BuildConfig, run: RunInfo, g: int, name: str, split: Split, mine: Sequence[ShardResult],
                 labels: Sequence[str]) -> tuple[Split, list[tuple[str, str, int]]]:
    """The split with generation g's shards after its own, placed so that hosts stay balanced, and its index."""
    count = len(mine)
    offset = generations.host_offset([s.num_records for s in split.shards], config.num_cores * config.num_hosts)
    placed = sorted((generations.position(r.index, count, offset), r) for r in mine)
    shards = [Shard(generations.shard_name(name, g, p, count, config.shard_extension), r.num_records, r.num_bytes,
                    r.crc32c, r.sha256, g) for p, r in placed]
    classes: Counter = Counter()
    for r in mine:
        classes.update(dict(r.class_counts))
    new_counts = {labels[i]: n for i, n in classes.items()}
    base = len(split.shards)
    index_file = _grown_index(config, run, g, name, split, [(base + p, r.index_part) for p, r in placed])
    grown = Split(num_records=split.num_records + sum(r.num_records for r in mine),
                  num_bytes=split.num_bytes + sum(r.num_bytes for r in mine),
                  class_counts=generations.merged_counts(split.class_counts, new_counts, labels),
                  shards=list(split.shards) + shards, index=index_file)
    moves = [(r.temp_path, shard.path, r.num_bytes) for (_, r), shard in zip(placed, shards)]
    return grown, moves


def _grown_index(config: BuildConfig, run: RunInfo, g: int, split_name: str, split: Split,
                 parts: Sequence[tuple[int, str]]) -> manifest.IndexFile:
    """The split's index over every generation, written in the run's temp folder (moved in when publishing)."""
    if split.index is None:
        raise InternalError(f"split {split_name!r} has no index to grow")
    name = generations.index_name(split_name, g)
    old_uri = storage.join(config.output, split.index.path)
    with storage.open_write(storage.join(run.temp_dir, name)) as out:
        try:
            written = generations.merge_generation_index(out, old_uri, split.index, parts,
                                                         index.index_schema(config.listing.extras))
        except (ValueError, storage.StorageError) as exc:
            raise PlanError(f"cannot append to {config.output}: {split.index.path}: {exc}; run tpu-shards verify on "
                            "it; nothing was written") from None
    return written.index_file(name)


def _grown_part(part: dict, new_reasons: Counter, new_count: int) -> dict:
    grown = dict(part)
    grown["count"] = int(part.get("count", 0)) + new_count
    grown["by_reason"] = _added(part.get("by_reason", {}), new_reasons)
    return grown


def _added(old: dict, new: Counter) -> dict:
    total = Counter(old)
    total.update(new)
    return dict(sorted((k, v) for k, v in total.items() if v))


def _cumulative(old: Manifest, old_path: str | None, entries: Sequence[dict], g: int) -> bytes:
    """The old report's bytes as they are, then this generation's entries (sorted, each with its generation)."""
    before = b""
    if old_path:
        try:
            before = storage.read_bytes(storage.join(old.location, old_path))
        except storage.NotFoundError:
            before = b""
    if before and not before.endswith(b"\n"):
        before += b"\n"
    return before + _jsonl([{**e, "generation": g} for e in entries])


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


def _duplicates(old: Manifest, config: BuildConfig, rejected: Sequence[dict], cross_split: Sequence[str]):
    if not config.dedup and old.duplicates is None:
        return None
    before = old.duplicates or {}
    return {"count": int(before.get("count", 0)) + sum(r["reason"] == "duplicate" for r in rejected),
            "cross_split": _added(before.get("cross_split", {}), Counter(cross_split))}


# ---------------------------------------------------------------------------------------------- publishing


def named_files(m: Manifest) -> set[str]:
    """Every file a manifest names: shards, indexes, reports."""
    names = {s.path for split in m.splits.values() for s in split.shards}
    names |= {split.index.path for split in m.splits.values() if split.index is not None}
    names |= {part["path"] for part in (m.rejected, m.skipped) if part.get("path")}
    return names


def is_dataset_file(name: str) -> bool:
    """Whether a name in a dataset folder is one of the job's shards, indexes or reports."""
    return bool(_SHARD_FILE.match(name) or _INDEX_FILE.match(name) or generations.REPORT_FILE.match(name)
                or name in (REJECTED_NAME, SKIPPED_NAME))


def publish_generation(config: BuildConfig, run: RunInfo, old: Manifest, grown: Grown) -> str:
    """Make the new generation visible; the old manifest and its files stay untouched until the new one is written."""
    out = config.output
    if not runlock.holds(out, run.run_id):
        raise UsageError(f"output {out}: this append lost its lock to another run (its lease ran out); "
                         "nothing was published")
    current = manifest.load(out)
    if current.created != old.created:
        raise UsageError(f"the dataset at {out} changed while this append ran; nothing was published")
    crash_point("publish-start")
    keep = named_files(old)
    for name in storage.list_names(out):  # leftovers of an interrupted earlier append
        if is_dataset_file(name) and name not in keep:
            storage.delete(storage.join(out, name))
    crash_point("publish-old-removed")
    for i, (temp, name, size) in enumerate(sorted(grown.moves, key=lambda m: m[1])):
        storage.rename(temp, storage.join(out, name), size=size)
        if i == 0:
            crash_point("publish-renaming")
    new = grown.manifest
    for name, split in new.splits.items():
        if split.index is not None and split.index != old.splits[name].index:
            storage.rename(storage.join(run.temp_dir, split.index.path), storage.join(out, split.index.path),
                           size=split.index.num_bytes)
    for name, data in grown.reports.items():
        storage.write_bytes(storage.join(out, name), data)
    crash_point("publish-before-manifest")
    storage.write_bytes(storage.join(out, MANIFEST_NAME), new.to_json().encode("utf-8"))  # the switch
    for name, data in tfds_files(new).items():
        storage.write_bytes(storage.join(out, name), data)
    for name in sorted(keep - named_files(new)):
        storage.delete(storage.join(out, name))
    remove_run_folder(config.temp_root, run.temp_dir)
    runlock.release(out, run.run_id)
    return storage.join(out, MANIFEST_NAME)
