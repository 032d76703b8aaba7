"""Finishing a build without Beam: check the shards and the accounting, then make the dataset visible.

Publishing replaces the dataset in place so that a reader starting from `manifest.json` never
sees a partial dataset: the old manifest goes first, then stale shards, the new shards are moved
in, the reports are written, and the new manifest comes last. A retried publish skips what it
already moved. A build that cannot publish leaves its reports in its temporary folder and fails
with one line saying why and where they are.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from shard_utils import index, plan, runlock, schema, storage, tfds_meta
from shard_utils.generations import REPORT_FILE, label_order
from shard_utils.manifest import (MANIFEST_NAME, REJECTED_NAME, SKIPPED_NAME, IndexFile, Manifest, Shard, Split,
                                  assemble)
from shard_utils.plan import InternalError, PlanError, SplitPlan

from .config import BuildConfig, RunInfo
from .errors import UsageError
from .local_pool import POOL_WORKER

TEMP_ROOT = ".tpu-shards-tmp"
OWN_NAMES = (TEMP_ROOT + "/", runlock.LOCK_NAME)  # what the job itself keeps in an output between builds
REPORTED_REASONS = 3  # reasons named in a failure's one line
_SHARD_FILE = re.compile(plan.SHARD_PATTERN)
_INDEX_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.index\.avro$")
# Files of a published dataset besides shards and indexes: removed before a new one is published.
_DATASET_FILES = (REJECTED_NAME, SKIPPED_NAME, tfds_meta.DATASET_INFO, tfds_meta.FEATURES, tfds_meta.LABELS)


def crash_point(stage: str) -> None:
    """Test hooks: TPU_SHARDS_KILL_AT=<stage> kills this process with SIGKILL at that stage;
    TPU_SHARDS_PAUSE_AT=<stage>:<seconds> sleeps there (once per process), to hold a build mid-way."""
    if os.environ.get("TPU_SHARDS_KILL_AT") == stage:
        if os.environ.get(POOL_WORKER):  # the stage runs in a local worker: the build itself is what dies
            os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get("TPU_SHARDS_PAUSE_AT", "")
    if pause.startswith(stage + ":") and stage not in _paused:
        _paused.add(stage)
        time.sleep(float(pause.split(":", 1)[1]))


_paused: set[str] = set()


@dataclass
class Tally:
    """Inputs seen, and those skipped without being read, by reason (and not-media ones by extension)."""

    seen: int = 0
    skipped: Counter = field(default_factory=Counter)
    extensions: Counter = field(default_factory=Counter)

    def skip(self, reason: str, extension: str) -> None:
        self.skipped[reason] += 1
        if reason == "not_media":
            self.extensions[extension or "(none)"] += 1


def sum_tallies(tallies: Iterable[Tally]) -> Tally:
    total = Tally()
    for t in tallies:
        total.seen += t.seen
        total.skipped.update(t.skipped)
        total.extensions.update(t.extensions)
    return total


@dataclass(frozen=True)
class ShardResult:
    """A shard written under its temporary name."""

    split: str
    index: int
    temp_path: str
    name: str
    num_records: int
    num_bytes: int
    crc32c: str
    sha256: str
    class_counts: tuple[tuple[int, int], ...]  # (label id, records)
    index_part: str = ""  # this shard's index rows (Avro), merged per split when publishing
    max_lengths: tuple[tuple[str, int], ...] = ()  # longest list per list feature (labels, extras)


# ---------------------------------------------------------------------------------------------- outputs


def output_content(output: str) -> list[str]:
    """What an output folder holds besides the job's own bookkeeping (temporary folders, the lock)."""
    return [n for n in storage.list_names(output) if n not in OWN_NAMES]


def temp_root_for(output: str, temp_location: str | None) -> str:
    """Where runs keep temporary data: under --temp_location when it is on the same kind of storage as the
    output (e.g. a bucket without soft delete), else in a hidden folder of the output."""
    if temp_location and storage.is_gcs(temp_location) == storage.is_gcs(output):
        import hashlib

        return storage.join(temp_location, "tpu-shards", hashlib.sha256(output.rstrip("/").encode()).hexdigest()[:16])
    return storage.join(output, TEMP_ROOT)


def clean_stale_runs(temp_root: str, run_id: str) -> None:
    """Remove temporary folders of earlier runs into this output (only while this run holds the lock,
    so none of them can still be working)."""
    for name in storage.list_names(temp_root):
        if name.rstrip("/") != run_id:
            try:
                storage.delete_prefix(storage.join(temp_root, name.rstrip("/")))
            except storage.StorageError:
                pass  # tried again by the next run


def remove_run_folder(temp_root: str, temp_dir: str) -> None:
    """Remove a finished run's temporary folder, and the folder of runs if nothing else is left in it."""
    try:
        storage.delete_prefix(temp_dir)
        if not storage.list_names(temp_root):
            storage.delete_prefix(temp_root)
    except storage.StorageError:
        pass  # hidden leftovers; the next run into this output removes them


def check_output_at_launch(config: BuildConfig, run_id: str, created: str) -> None:
    """For a run decided inside the job (a template launch): take the lock and apply the overwrite rule."""
    try:
        runlock.acquire(config.output, run_id, created)
    except runlock.OutputBusy as exc:
        raise UsageError(str(exc)) from None
    if output_content(config.output) and not config.overwrite:
        runlock.release(config.output, run_id)
        raise UsageError(f"output {config.output} is not empty; pass --overwrite to replace the dataset there")
    clean_stale_runs(config.temp_root, run_id)


_renewed_at: dict[str, float] = {}


def keep_lease(config: BuildConfig, run: RunInfo) -> None:
    """Renew this run's lock on the output now and then while workers work: a template launch has no
    driver to do it, and a Dataflow job goes on when its driver stops waiting."""
    now = time.monotonic()
    if now - _renewed_at.get(run.run_id, 0.0) < runlock.LEASE_SECONDS / 4:
        return
    _renewed_at[run.run_id] = now
    try:
        runlock.renew(config.output, run.run_id)
    except storage.StorageError:
        pass  # tried again later; the lease is long


# ---------------------------------------------------------------------------------------------- finish


def finish(results: list[ShardResult], config: BuildConfig, *, plans: list[dict], failure: list[str],
           rejected: list[dict], skipped_files: list[dict], tally: Tally, labels: list[str], run: RunInfo,
           cross_split: Sequence[str] = (), known_labels: Sequence[str] = (),
           adjust: Callable[[Manifest], Manifest] | None = None) -> str:
    """Publish the dataset, or fail with one line: planning failed, or more files were rejected than allowed.

    `known_labels` keep their ids (see build_manifest); `adjust` changes the manifest before it is published
    (a reshard carries the source's fields over)."""
    report = storage.join(run.temp_dir, "report")
    if failure:
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(failure[0], rejected, tally, report))
    stills = tally.skipped.get("still_image", 0)
    if config.video is not None and stills:
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(
            f"a dataset holds video clips or still images, not both: this video build (--video-frames) found "
            f"{stills} still images; build them into another output without --video-frames", rejected, tally,
            report))
    manifest = build_manifest(config, run, results, plans[0], rejected, tally, labels, bool(skipped_files),
                              known_labels)
    if adjust is not None:
        manifest = adjust(manifest)
    if config.dedup:
        manifest.duplicates = {"count": sum(r["reason"] == "duplicate" for r in rejected),
                               "cross_split": dict(sorted(Counter(cross_split).items()))}
    if config.max_rejected.exceeded(len(rejected), tally.seen):
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(
            f"{len(rejected)} of {tally.seen} files were rejected, more than --max-rejected {config.max_rejected} "
            "allows; nothing was published", rejected, tally, report))
    return publish(config, run, manifest, results, rejected, skipped_files)


def build_manifest(config: BuildConfig, run: RunInfo, results: Sequence[ShardResult], plans: Mapping[str, SplitPlan],
                   rejected: Sequence[dict], tally: Tally, labels: Sequence[str], has_skipped_files: bool,
                   known_labels: Sequence[str] = ()) -> Manifest:
    """The manifest for a finished build, with each split's index merged from its shards' parts;
    InternalError if a shard is missing or the accounting does not close. Label ids are the sorted names,
    after `known_labels`, which keep theirs."""
    names = label_order(labels, known_labels)
    splits = {}
    longest: Counter = Counter()
    for r in results:
        for key, n in r.max_lengths:
            longest[key] = max(longest[key], n)
    for split, split_plan in sorted(plans.items()):
        mine = sorted((r for r in results if r.split == split), key=lambda r: r.index)
        if [r.index for r in mine] != list(range(split_plan.num_shards)):
            raise InternalError(f"split {split!r}: expected {split_plan.num_shards} shards, got {len(mine)}")
        classes: Counter = Counter()
        for r in mine:
            classes.update(dict(r.class_counts))
        splits[split] = Split(
            num_records=sum(r.num_records for r in mine), num_bytes=sum(r.num_bytes for r in mine),
            class_counts={name: classes.get(i, 0) for i, name in enumerate(names)},
            shards=[Shard(r.name, r.num_records, r.num_bytes, r.crc32c, r.sha256) for r in mine],
            index=merge_index(config, run, split, mine))
    image = config.image
    multi_label = config.listing.multi_label or longest[schema.LABEL] > 1
    video = config.video
    embedding = None
    if config.embed is not None:
        info = dict(config.embed_info)
        dim = int(info["embedding_dim"])
        shape = [video.frames, dim] if video else [dim]
        embedding = {"key": config.embed_key, "shape": shape, **info}
    features = schema.feature_table(
        media="video" if video else "image", num_frames=video.frames if video else None, multi_label=multi_label,
        extras=config.listing.extras, max_lengths=longest, embedding_key=embedding["key"] if embedding else None,
        embedding_shape=embedding["shape"] if embedding else None)
    return assemble(
        splits=splits, rejected=rejected, skipped=dict(tally.skipped), skipped_extensions=dict(tally.extensions),
        seen=tally.seen, skipped_path=SKIPPED_NAME if has_skipped_files else None,
        tool_version=config.tool_version, created=run.created, input=config.input or "",
        options=config.manifest_options(), features=features, labels=names, multi_label=multi_label,
        media="video" if video else "image", embedding=embedding,
        image_size=list(image.size) if image.size and image.resize != "fit" else None,
        num_cores=config.num_cores, num_hosts=config.num_hosts, label_offset=config.label_offset)


def merge_index(config: BuildConfig, run: RunInfo, split: str, shards: Sequence[ShardResult]) -> IndexFile:
    """One split's index from its shards' parts, in shard order, written in the run's temp folder."""
    name = index.index_name(split)
    with storage.open_write(storage.join(run.temp_dir, name)) as out:
        written = index.merge_index_parts(out, (storage.open_read(r.index_part) for r in shards),
                                          index.index_schema(config.listing.extras))
    return written.index_file(name)


def tfds_files(manifest: Manifest) -> dict[str, bytes]:
    """TFDS's metadata files, so `tfds.builder_from_directory` reads the dataset; none where TFDS cannot
    describe it (video, or split names TFDS refuses)."""
    try:
        return tfds_meta.tfds_files(manifest)
    except ValueError:
        return {}


def failure_message(why: str, rejected: Sequence[dict], tally: Tally, report: str) -> str:
    """One line: why nothing was published, the top rejection reasons with an example each, and where
    the full lists are."""
    parts = [why]
    by_reason = Counter(r["reason"] for r in rejected)
    if by_reason:
        examples = {}
        for r in sorted(rejected, key=lambda r: r["source"]):
            examples.setdefault(r["reason"], r)
        shown = [f"{n} {reason} (e.g. {examples[reason]['source']}: {examples[reason]['message']})"
                 for reason, n in by_reason.most_common(REPORTED_REASONS)]
        more = len(by_reason) - REPORTED_REASONS
        parts.append("rejected: " + ", ".join(shown) + (f" and {more} more reasons" if more > 0 else ""))
    skipped = sum(tally.skipped.values())
    if skipped:
        exts = ", ".join(f"{ext} {n}" for ext, n in tally.extensions.most_common(5))
        parts.append(f"skipped {skipped} ({', '.join(f'{k} {v}' for k, v in tally.skipped.most_common())}"
                     + (f"; not media: {exts}" if exts else "") + ")")
    if rejected or skipped:
        parts.append(f"skipped files are listed beside {storage.join(report, REJECTED_NAME)}" if not rejected else
                     f"every rejected file is listed with its reason in {storage.join(report, REJECTED_NAME)}")
    return "; ".join(parts)


def write_reports(folder: str, rejected: Sequence[dict], skipped_files: Sequence[dict]) -> None:
    """rejected.jsonl and skipped.jsonl, sorted, in a folder (nothing when there is nothing to report)."""
    if not rejected and not skipped_files:
        return
    storage.write_bytes(storage.join(folder, REJECTED_NAME), _jsonl(rejected))
    storage.write_bytes(storage.join(folder, SKIPPED_NAME), _jsonl(skipped_files))


def _jsonl(entries: Sequence[dict]) -> bytes:
    lines = sorted(entries, key=lambda r: (r["source"], r["reason"]))
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode("utf-8")


def publish(config: BuildConfig, run: RunInfo, manifest: Manifest, results: Sequence[ShardResult],
            rejected: Sequence[dict], skipped_files: Sequence[dict]) -> str:
    """Make the new dataset visible: old manifest out, stale files out, shards in, reports, manifest last."""
    out = config.output
    if not runlock.holds(out, run.run_id):
        raise UsageError(f"output {out}: this build lost its lock to another build (its lease ran out); "
                         "nothing was published")
    crash_point("publish-start")
    storage.delete(storage.join(out, MANIFEST_NAME))
    new_names = {r.name for r in results}
    for name in storage.list_names(out):
        if ((_SHARD_FILE.match(name) and name not in new_names) or name in _DATASET_FILES or _INDEX_FILE.match(name)
                or REPORT_FILE.match(name)):
            storage.delete(storage.join(out, name))
    crash_point("publish-old-removed")
    for i, r in enumerate(sorted(results, key=lambda r: r.name)):
        storage.rename(r.temp_path, storage.join(out, r.name), size=r.num_bytes)  # a retry skips moved ones
        if i == 0:
            crash_point("publish-renaming")
    for split in manifest.splits.values():
        storage.rename(storage.join(run.temp_dir, split.index.path), storage.join(out, split.index.path),
                       size=split.index.num_bytes)
    storage.write_bytes(storage.join(out, REJECTED_NAME), _jsonl(rejected))
    if skipped_files:
        storage.write_bytes(storage.join(out, SKIPPED_NAME), _jsonl(skipped_files))
    for name, data in tfds_files(manifest).items():
        storage.write_bytes(storage.join(out, name), data)
    crash_point("publish-before-manifest")
    storage.write_bytes(storage.join(out, MANIFEST_NAME), manifest.to_json().encode("utf-8"))
    remove_run_folder(config.temp_root, run.temp_dir)
    runlock.release(out, run.run_id)
    return storage.join(out, MANIFEST_NAME)
