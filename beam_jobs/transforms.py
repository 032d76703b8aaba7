"""The composite PTransforms of the shard-building job, one per step of the data flow.

Only small references travel through Beam's shuffles: encoded records are written once
to temporary fragment files by the encoder, and each shard writer reads back just the
records of its own shard. Exact balance comes from ranking records by a seeded hash.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from shard_utils import inputs, plan, schema, storage
from shard_utils.images import Rejected, prepare_image
from shard_utils.manifest import MANIFEST_NAME, REJECTED_NAME, Manifest, Shard, Split
from shard_utils.tfrecord import frame

from .config import BuildConfig

NAMESPACE = "tpu_shards"
FAILURE_NAME = "plan-failure.txt"  # in the run's temp folder: why no dataset was published
LOG = logging.getLogger("tpu_shards")


def crash_point(stage: str) -> None:
    """Test hook: TPU_SHARDS_KILL_AT=<stage> kills this process with SIGKILL at that stage."""
    if os.environ.get("TPU_SHARDS_KILL_AT") == stage:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class MediaFile:
    """A listed media file waiting to be encoded."""

    rel_path: str
    size: int
    label: str
    split: str | None


@dataclass(frozen=True)
class RecordRef:
    """Where one encoded record waits in a fragment file, and what the planner needs to know of it."""

    split: str
    sort_key: int
    source_id: str
    label: str
    fragment: str
    offset: int
    length: int


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
    class_counts: tuple[tuple[str, int], ...]


def reject(source: str, reason: str, message: str) -> beam.pvalue.TaggedOutput:
    Metrics.counter(NAMESPACE, f"rejected_{reason}").inc()
    return beam.pvalue.TaggedOutput("rejected", {"source": source, "reason": reason, "message": message})


class ListMedia(beam.PTransform):
    """Streams the files under the input and sorts them into media, skipped (by reason) and rejected.

    Outputs tagged `media` (MediaFile), `skipped` (reason strings), `rejected` (dicts) and
    `seen` (one 1 per listed file, for the accounting).
    """

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        listed = (
            pbegin
            | "Root" >> beam.Create([self.config.input])
            | "Walk" >> beam.FlatMap(storage.walk)
            | "Spread" >> beam.Reshuffle()
            | "Classify" >> beam.FlatMap(_classify, self.config.split_dirs).with_outputs(
                "skipped", "rejected", "seen", main="media")
        )
        return listed


def _classify(entry: storage.Entry, split_dirs: bool):
    Metrics.counter(NAMESPACE, "files_matched").inc()
    yield beam.pvalue.TaggedOutput("seen", 1)
    skip = inputs.skip_reason(entry.rel_path.rstrip("/"))
    if entry.reason is not None and skip not in ("hidden", "system"):
        # A link or folder we cannot read may hold images: say so rather than skip it quietly.
        yield reject(entry.rel_path, entry.reason, entry.message or entry.reason)
        return
    if skip is not None:
        Metrics.counter(NAMESPACE, f"skipped_{skip}").inc()
        yield beam.pvalue.TaggedOutput("skipped", skip)
        return
    split, label = inputs.split_and_label(entry.rel_path, split_dirs)
    if label is None:
        where = "its split folder" if split_dirs else "the input folder"
        yield reject(entry.rel_path, "no_label", f"file sits directly in {where}, not in a label folder")
        return
    yield MediaFile(entry.rel_path, entry.size, label, split)


class EncodeImages(beam.PTransform):
    """Reads, validates and encodes each media file into a framed tf.Example in a temporary fragment.

    Main output: RecordRef; tagged `rejected`: dicts for files that are not usable images.
    """

    def __init__(self, config: BuildConfig, labels):
        super().__init__()
        self.config = config
        self.labels = labels

    def expand(self, media):
        return media | "Encode" >> beam.ParDo(_EncodeFn(self.config), beam.pvalue.AsList(self.labels)).with_outputs(
            "rejected", main="records")


class _EncodeFn(beam.DoFn):
    def __init__(self, config: BuildConfig):
        self.config = config
        self._label_ids: dict[str, int] | None = None

    def start_bundle(self):
        self._fragment = None
        self._writer = None
        self._offset = 0

    def process(self, media: MediaFile, labels: list[str]):
        if self._label_ids is None:
            self._label_ids = {name: i for i, name in enumerate(sorted(labels))}
        cfg = self.config
        try:
            data = read_source(storage.join(cfg.input, media.rel_path))
        except Exception as exc:
            yield reject(media.rel_path, "unreadable", _first_line(exc))
            return
        try:
            image = prepare_image(data, cfg.image)
        except Rejected as exc:
            yield reject(media.rel_path, exc.reason, exc.message)
            return
        except Exception as exc:  # a decoder bug must not end a three-hour job; the file is accounted for
            yield reject(media.rel_path, "corrupt", f"{type(exc).__name__}: {_first_line(exc)}")
            return
        crash_point("encode")
        record = schema.ImageRecord(
            encoded=image.encoded, height=image.height, width=image.width, channels=image.channels,
            label=self._label_ids[media.label], label_text=media.label, source_id=media.rel_path,
            sha256=_sha256(data))
        framed = frame(schema.encode_example(record))
        split = media.split or plan.choose_split(cfg.splits, cfg.seed, media.rel_path)
        offset = self._append(framed)
        Metrics.counter(NAMESPACE, "images_passed_through" if image.passed_through else "images_reencoded").inc()
        yield RecordRef(split, plan.sort_key(cfg.seed, media.rel_path), media.rel_path, media.label,
                        self._fragment, offset, len(framed))

    def _append(self, framed: bytes) -> int:
        if self._writer is None:
            self._fragment = storage.join(self.config.temp_dir, "fragments", f"{uuid.uuid4().hex}.records")
            self._writer = FileSystems.create(self._fragment, compression_type="uncompressed")
            self._offset = 0
        offset = self._offset
        self._writer.write(framed)
        self._offset += len(framed)
        return offset

    def finish_bundle(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_source(path: str) -> bytes:
    """A source file's bytes: gs:// through Beam's FileSystems (gcsio, with retries), local files directly
    (FileSystems costs about a millisecond per local open, more than validating the image)."""
    if storage.is_gcs(path):
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


class PlanShards(beam.PTransform):
    """Totals records and bytes per split and plans each split's shards; output: one {split: SplitPlan}."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, records):
        return (
            records
            | "SizePerSplit" >> beam.Map(lambda r: (r.split, (1, r.length)))
            | "SumPerSplit" >> beam.CombinePerKey(lambda vs: tuple(map(sum, zip(*vs))) if vs else (0, 0))
            | "Together" >> beam.combiners.ToList()
            | "Plan" >> beam.Map(plan_or_failure, self.config)
        )


@dataclass(frozen=True)
class PlanFailure:
    """Why the dataset cannot be sharded (a PlanError's message), carried through the pipeline as a value.

    Raising in a worker would make Dataflow retry the step and make a local worker process print a
    traceback; instead no shard is written, Publish leaves the message for the driver, and the
    driver raises it as one PlanError.
    """

    message: str


def plan_or_failure(totals: list[tuple[str, tuple[int, int]]], config: BuildConfig):
    """make_plans, with a PlanError turned into a PlanFailure value."""
    try:
        return make_plans(totals, config)
    except plan.PlanError as exc:
        return PlanFailure(str(exc))


def planning_failure(temp_dir: str) -> str | None:
    """The PlanFailure message a finished run left in its temp folder, if planning failed."""
    path = storage.join(temp_dir, FAILURE_NAME)
    return storage.read_bytes(path).decode("utf-8") if storage.exists(path) else None


def make_plans(totals: list[tuple[str, tuple[int, int]]], config: BuildConfig) -> dict[str, plan.SplitPlan]:
    """Plans for every split; a split named in --splits that got no record is a PlanError."""
    found = dict(totals)
    if not found:
        raise plan.PlanError("no input file could be used as an image (0 records); see the rejected files' reasons")
    if not config.split_dirs:
        missing = [name for name, _ in config.splits if name not in found]
        if missing:
            raise plan.PlanError(f"split {missing[0]!r} received no records from --splits; give it a larger "
                                 "fraction or add images")
    return {
        split: plan.plan_split(split, n, size, num_cores=config.num_cores, num_hosts=config.num_hosts,
                               target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards)
        for split, (n, size) in sorted(found.items())
    }


class AssignShards(beam.PTransform):
    """Ranks every record within its split by seeded hash and keys it by (split, shard index).

    Ranking groups only small references, in hash buckets of about ten thousand, so no
    worker holds a split's records.
    """

    def __init__(self, plans):
        super().__init__()
        self.plans = plans

    def expand(self, records):
        plans = beam.pvalue.AsSingleton(self.plans)
        bucketed = records | "Bucket" >> beam.FlatMap(_bucket, plans)
        counts = (
            bucketed
            | "One" >> beam.Map(lambda kv: (kv[0], 1))
            | "CountPerBucket" >> beam.CombinePerKey(sum)
            | "AllCounts" >> beam.combiners.ToDict()
        )
        return (
            bucketed
            | "GroupBucket" >> beam.GroupByKey()
            | "Rank" >> beam.FlatMap(_rank_bucket, plans, beam.pvalue.AsSingleton(counts))
        )


def _bucket(record: RecordRef, plans):
    """(split, hash bucket) -> record; nothing when planning failed (no shard will be written)."""
    if isinstance(plans, PlanFailure):
        return
    yield (record.split, plan.bucket_of(record.sort_key, plans[record.split].buckets)), record


def _rank_bucket(item, plans: dict[str, plan.SplitPlan], counts: dict[tuple[str, int], int]):
    (split, bucket), refs = item
    split_plan = plans[split]
    offset = sum(counts.get((split, b), 0) for b in range(bucket))
    starts = split_plan.starts
    for j, ref in enumerate(sorted(refs, key=lambda r: (r.sort_key, r.source_id))):
        rank = offset + j
        yield (split, plan.shard_of_rank(rank, starts)), (rank, ref)


class WriteShards(beam.PTransform):
    """Writes each shard, records in rank order, under a temporary name; output: ShardResult."""

    def __init__(self, config: BuildConfig, plans):
        super().__init__()
        self.config = config
        self.plans = plans

    def expand(self, assigned):
        return (
            assigned
            | "GroupShard" >> beam.GroupByKey()
            | "Write" >> beam.Map(_write_shard, self.config, beam.pvalue.AsSingleton(self.plans))
        )


def _write_shard(item, config: BuildConfig, plans: dict[str, plan.SplitPlan]) -> ShardResult:
    (split, index), ranked = item
    ranked = sorted(ranked, key=lambda x: x[0])
    split_plan = plans[split]
    start = split_plan.starts[index]
    expected = plan.shard_sizes(split_plan.num_records, split_plan.num_shards)[index]
    if [rank for rank, _ in ranked] != list(range(start, start + expected)):
        raise plan.PlanError(f"shard {index} of split {split!r} did not receive ranks {start}..{start + expected - 1}")
    data = _read_records([ref for _, ref in ranked])
    name = plan.shard_name(split, index, split_plan.num_shards)
    temp_path = storage.join(config.temp_dir, "shards", name)
    digest = storage.Digest()
    crash_point("write")
    with FileSystems.create(temp_path, compression_type="uncompressed") as out:
        for _, ref in ranked:
            record = data[(ref.fragment, ref.offset)]
            out.write(record)
            digest.update(record)
    Metrics.counter(NAMESPACE, "shards_written").inc()
    Metrics.counter(NAMESPACE, "bytes_written").inc(digest.size)
    Metrics.counter(NAMESPACE, "images_written").inc(len(ranked))
    classes = Counter(ref.label for _, ref in ranked)
    return ShardResult(split, index, temp_path, name, len(ranked), digest.size, digest.crc32c, digest.sha256,
                       tuple(sorted(classes.items())))


def _read_records(refs: list[RecordRef]) -> dict[tuple[str, int], bytes]:
    """Read the framed records of one shard, one sequential pass per fragment file."""
    by_fragment: dict[str, list[RecordRef]] = defaultdict(list)
    for ref in refs:
        by_fragment[ref.fragment].append(ref)
    out = {}
    for fragment, items in by_fragment.items():
        with FileSystems.open(fragment, compression_type="uncompressed") as f:
            for ref in sorted(items, key=lambda r: r.offset):
                f.seek(ref.offset)
                record = f.read(ref.length)
                if len(record) != ref.length:
                    raise IOError(f"fragment {fragment} is short at offset {ref.offset}")
                out[(fragment, ref.offset)] = record
    return out


class FinalizeDataset(beam.PTransform):
    """Checks the shards against the plan and the accounting, then publishes: old manifest out,
    shards under final names, rejected.jsonl, and manifest.json last."""

    def __init__(self, config: BuildConfig, plans, rejected, skipped, seen, labels):
        super().__init__()
        self.config = config
        self.side = (plans, rejected, skipped, seen, labels)

    def expand(self, shards):
        plans, rejected, skipped, seen, labels = self.side
        return (
            shards
            | "AllShards" >> beam.combiners.ToList()
            | "Publish" >> beam.Map(
                publish, self.config,
                beam.pvalue.AsSingleton(plans),
                beam.pvalue.AsSingleton(rejected | "AllRejected" >> beam.combiners.ToList()),
                beam.pvalue.AsSingleton(skipped | "CountSkipped" >> beam.combiners.Count.PerElement()
                                        | "SkippedDict" >> beam.combiners.ToDict()),
                beam.pvalue.AsSingleton(seen | "CountSeen" >> beam.combiners.Count.Globally()),
                beam.pvalue.AsList(labels))
        )


def build_manifest(config: BuildConfig, results: list[ShardResult], plans: dict[str, plan.SplitPlan],
                   rejected: list[dict], skipped: dict[str, int], seen: int, labels: list[str]) -> Manifest:
    """The manifest for a finished build; raises PlanError if a shard is missing or the accounting does not close."""
    splits = {}
    for split, split_plan in sorted(plans.items()):
        mine = sorted((r for r in results if r.split == split), key=lambda r: r.index)
        if [r.index for r in mine] != list(range(split_plan.num_shards)):
            raise plan.PlanError(f"split {split!r}: expected {split_plan.num_shards} shards, got {len(mine)}")
        classes: Counter = Counter()
        for r in mine:
            classes.update(dict(r.class_counts))
        splits[split] = Split(
            num_records=sum(r.num_records for r in mine), num_bytes=sum(r.num_bytes for r in mine),
            class_counts={name: classes.get(name, 0) for name in sorted(labels)},
            shards=[Shard(r.name, r.num_records, r.num_bytes, r.crc32c, r.sha256) for r in mine])
    written = sum(s.num_records for s in splits.values())
    n_skipped = sum(skipped.values())
    if seen != written + len(rejected) + n_skipped:
        raise plan.PlanError(f"accounting does not close: {seen} files seen, {written} written, "
                             f"{len(rejected)} rejected, {n_skipped} skipped")
    by_reason = Counter(r["reason"] for r in rejected)
    return Manifest(
        tool_version=config.tool_version, created=config.created, input=config.input,
        options=config.manifest_options(), features=schema.FEATURES, labels=sorted(labels), splits=splits,
        rejected={"count": len(rejected), "by_reason": dict(sorted(by_reason.items())), "path": REJECTED_NAME},
        skipped={"count": n_skipped, "by_reason": dict(sorted(skipped.items()))}, files_seen=seen,
        image_size=list(config.image.size) if config.image.size and config.image.resize != "fit" else None,
        num_cores=config.num_cores, num_hosts=config.num_hosts)


_OLD_FILE = re.compile(plan.SHARD_PATTERN)


def publish(results: list[ShardResult], config: BuildConfig, plans, rejected, skipped, seen, labels) -> str:
    """Make the new dataset visible: remove the old manifest and shards, rename, write rejects, manifest last.

    When planning failed, nothing is touched: the failure is left in the temp folder for the driver.
    """
    if isinstance(plans, PlanFailure):
        storage.write_bytes(storage.join(config.temp_dir, FAILURE_NAME), plans.message.encode("utf-8"))
        return ""
    manifest = build_manifest(config, results, plans, rejected, skipped, seen, labels)
    out = config.output
    crash_point("publish-start")
    storage.delete(storage.join(out, MANIFEST_NAME))
    new_names = {r.name for r in results}
    for name in storage.list_names(out):
        if (_OLD_FILE.match(name) and name not in new_names) or name == REJECTED_NAME:
            storage.delete(storage.join(out, name))
    crash_point("publish-old-removed")
    for i, r in enumerate(sorted(results, key=lambda r: r.name)):
        final = storage.join(out, r.name)
        if FileSystems.exists(r.temp_path) or not FileSystems.exists(final):  # a retried publish skips moved ones
            FileSystems.rename([r.temp_path], [final])
        if i == 0:
            crash_point("publish-renaming")
    lines = sorted(rejected, key=lambda r: (r["source"], r["reason"]))
    storage.write_bytes(storage.join(out, REJECTED_NAME),
                        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode("utf-8"))
    crash_point("publish-before-manifest")
    storage.write_bytes(storage.join(out, MANIFEST_NAME), manifest.to_json().encode("utf-8"))
    try:
        FileSystems.delete([config.temp_dir + "/" if storage.is_gcs(config.temp_dir) else config.temp_dir])
        if not storage.is_gcs(config.temp_dir):
            os.rmdir(os.path.dirname(config.temp_dir))  # only if no other run's temp is there
    except Exception as exc:  # leftovers are hidden and removed by the next --overwrite; not worth failing for
        LOG.info("temporary folder %s not fully removed: %s", config.temp_dir, _first_line(exc))
    return storage.join(out, MANIFEST_NAME)
