"""Finishing a build without Beam: check the shards and the accounting, then make the dataset visible.

Publishing is four steps, each safe to run twice or twice at once (Dataflow runs every step at least
once), the middle two in parallel over shards and splits:

    plan_publication (once)  the checks (planning failed? too many rejects?), the manifest to write, the moves
    clear_output (once)      the old manifest out, then files it named that the new dataset does not reuse
    move_shard (per shard)   the shard from the run's temporary folder to its name in the output
    merge_index (per split)  the split's index: a header, then each shard's index blocks in order
    commit (once)            reports, TFDS and Croissant metadata, the card README.md, and the manifest last;
                             temporary data removed, lock released

A reader starting from `manifest.json` never sees a partial dataset. An append (`append_publish`) plans
differently and leaves the old manifest and every file it names alone until its new manifest replaces it.
A build that cannot publish leaves its reports in its temporary folder and fails with one line saying why.
"""
from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from beam_jobs.errors import UsageError
from beam_jobs.jobs.config import BuildConfig, RunInfo
from beam_jobs.publish.reports import PIECES_FOLDER, Report, as_report, write_report
from shard_utils import storage
from shard_utils.errors import InternalError, PlanError
from shard_utils.format import croissant, index, schema, shard_formats
from shard_utils.format.filenames import (
    CARD_NAME,
    CROISSANT_NAME,
    INDEX_FILE,
    LOCK_NAME,
    QUALITY_NAME,
    REPORT_FILE,
    TEMP_ROOT,
    TFDS_LABELS_BEFORE,
)
from shard_utils.format.labels import label_order
from shard_utils.format.manifest import (
    MANIFEST_NAME,
    REJECTED_NAME,
    SKIPPED_NAME,
    IndexFile,
    Manifest,
    ManifestError,
    Shard,
    Split,
    assemble,
    load,
    parse,
)
from shard_utils.format.shard_formats import ARRAY_RECORD, TFRECORD
from shard_utils.media.reads import prefetched
from shard_utils.quality import findings
from shard_utils.read import card, tfds_meta
from shard_utils.sharding.writer import ShardResult
from shard_utils.storage import lock as runlock
from shard_utils.text import printable

OWN_NAMES = (TEMP_ROOT + "/", LOCK_NAME)  # what the job itself keeps in an output between builds
REPORTED_REASONS = 3  # reasons named in a failure's one line
# Files of a published dataset besides shards and indexes: removed before a new one is published.
_DATASET_FILES = (REJECTED_NAME, SKIPPED_NAME, QUALITY_NAME, tfds_meta.DATASET_INFO, tfds_meta.FEATURES, tfds_meta.LABELS,
                  TFDS_LABELS_BEFORE, CROISSANT_NAME, CARD_NAME)

__all__ = ["ShardResult", "Tally", "Move", "IndexJob", "Publication", "plan_publication", "clear_output",
           "move_shard", "merge_index", "commit", "finish", "published_by"]


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


def remove_unfinished_writes(output: str) -> None:
    """Remove the temporary files a killed run left beside the dataset's own files (only while this run holds
    the lock, so no other run can be writing them)."""
    ours = {MANIFEST_NAME, LOCK_NAME, *_DATASET_FILES}
    for temp, name in storage.unfinished_writes(output):
        if name in ours or is_dataset_file(name):
            try:
                storage.delete(storage.join(output, temp))
            except storage.StorageError:
                pass  # tried again by the next run


def remove_orphaned_files(output: str) -> None:
    """After a failed run that holds the lock: when the output has no manifest (the run removed it, then failed
    before writing its own), remove the dataset files left there, so the output is empty, not a dataset without
    its contract. With a manifest (an append, or a run that failed before it touched the output), nothing."""
    names = storage.list_names(output)
    if MANIFEST_NAME in names:
        return
    for name in names:
        if is_dataset_file(name) or name in _DATASET_FILES:
            try:
                storage.delete(storage.join(output, name))
            except storage.StorageError:
                pass  # the next run into this output removes it (clear_output)


def remove_run_folder(temp_root: str, temp_dir: str) -> None:
    """Remove a finished run's temporary folder, and the folder of runs if nothing else is left in it."""
    try:
        storage.delete_prefix(temp_dir)
        if not storage.list_names(temp_root):
            storage.delete_prefix(temp_root)
    except storage.StorageError:
        pass  # hidden leftovers; the next run into this output removes them


def tfds_files(manifest: Manifest) -> dict[str, bytes]:
    """TFDS's metadata files, so `tfds.builder_from_directory` reads the dataset; none where TFDS cannot
    describe it (video, or split names TFDS refuses)."""
    try:
        return tfds_meta.tfds_files(manifest)
    except ValueError:
        return {}


def described_files(manifest: Manifest, output: str) -> dict[str, bytes]:
    """Every file derived from the manifest beside it in `output`: TFDS's metadata, croissant.json and the card
    README.md (both named after the output folder unless --name was given)."""
    placed = replace(manifest, location=output)
    return {**tfds_files(manifest), CROISSANT_NAME: croissant.croissant_bytes(placed),
            CARD_NAME: card.card_bytes(placed)}


def failure_message(why: str, rejected: Report | Sequence[dict], tally: Tally, report: str) -> str:
    """One line: why nothing was published, the top rejection reasons with an example each, and where
    the full lists are (from the counts alone)."""
    parts = [why]
    counts = as_report(rejected).counts
    if counts.by_reason:
        shown = [printable(f"{n} {reason} (e.g. {counts.example(reason)['source']}: {counts.example(reason)['message']})")
                 for reason, n in counts.by_reason.most_common(REPORTED_REASONS)]
        more = len(counts.by_reason) - REPORTED_REASONS
        parts.append("rejected: " + ", ".join(shown) + (f" and {more} more reasons" if more > 0 else ""))
    skipped = sum(tally.skipped.values())
    if skipped:
        exts = ", ".join(f"{printable(ext)} {n}" for ext, n in tally.extensions.most_common(5))
        parts.append(f"skipped {skipped} ({', '.join(f'{k} {v}' for k, v in tally.skipped.most_common())}"
                     + (f"; not media: {exts}" if exts else "") + ")")
    if counts.count or skipped:
        parts.append(f"skipped files are listed beside {storage.join(report, REJECTED_NAME)}" if not counts.count
                     else f"every rejected file is listed with its reason in {storage.join(report, REJECTED_NAME)}")
    return "; ".join(parts)


def write_reports(folder: str, rejected: Report, skipped_files: Report) -> None:
    """rejected.jsonl and skipped.jsonl, sorted, in a folder of the run's (nothing when there is nothing to
    report)."""
    if not len(rejected) and not len(skipped_files):
        return
    scratch = storage.join(storage.parent(folder), PIECES_FOLDER)
    write_report(rejected, storage.join(folder, REJECTED_NAME), scratch)
    write_report(skipped_files, storage.join(folder, SKIPPED_NAME), scratch)


def published_by(output: str, run: RunInfo) -> bool:
    """Whether the dataset in `output` is the one this run published (a retried step then has nothing to do)."""
    try:
        return load(output).created == run.created
    except (ManifestError, storage.StorageError):
        return False


# ---------------------------------------------------------------------------------------------- the plan


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


def plan_publication(results: Sequence[ShardResult], config: BuildConfig, *, plans: Sequence[Mapping], failure: Sequence[str],
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
    manifest = build_manifest(config, run, results, plans[0], rejected.counts.by_reason, tally, labels,
                              bool(len(skipped_files)), known_labels)
    if adjust is not None:
        manifest = adjust(manifest)
    if config.dedup:
        manifest.duplicates = {"count": rejected.counts.by_reason.get("duplicate", 0),
                               "cross_split": dict(sorted(Counter(cross_split).items()))}
    if config.max_rejected.exceeded(len(rejected), tally.seen):
        write_reports(report, rejected, skipped_files)
        raise PlanError(failure_message(
            f"{len(rejected)} of {tally.seen} files were rejected, more than --max-rejected {config.max_rejected} "
            "allows; nothing was published", rejected, tally, report))
    moves = shard_moves(results, config.formats)
    extras = tuple(config.listing.extras)
    indexes = tuple(IndexJob(name, index.index_name(name), tuple(r.index_part for r in _in_place_order(results, name)),
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


def quality_section(by_kind: Mapping[str, int], path: str) -> dict:
    """The manifest's quality section: the findings' count, their count per kind (every kind named), the report."""
    counts = {kind: int(by_kind.get(kind, 0)) for kind in findings.KINDS}
    return {"count": sum(counts.values()), "by_kind": counts, "path": path}


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


def twin_entry(r: ShardResult) -> Shard:
    """The manifest entry of a shard's ArrayRecord twin."""
    if r.array_record is None:
        raise InternalError(f"shard {r.name} has no ArrayRecord twin")
    t = r.array_record
    return Shard(t.name, t.num_records, t.num_bytes, t.crc32c, t.sha256)


def _in_place_order(results: Sequence[ShardResult], split: str) -> list[ShardResult]:
    return sorted((r for r in results if r.split == split), key=lambda r: r.place)


def build_manifest(config: BuildConfig, run: RunInfo, results: Sequence[ShardResult], plans: Mapping,
                   rejected: Mapping[str, int], tally: Tally, labels: Sequence[str], has_skipped_files: bool,
                   known_labels: Sequence[str] = ()) -> Manifest:
    """The manifest of a finished build, without its splits' index entries (see `commit`); InternalError if a
    shard is missing or the accounting does not close. Label ids are the names in label order (numeric when every
    label is an integer; `labels.label_order`), after `known_labels`, which keep theirs. `plans`: each split's plan
    (anything with `num_shards`); `rejected`: the rejects by reason."""
    names = label_order(labels, known_labels)
    first = shard_formats.get(config.formats[0])  # what `shards` are: TFRecord when published
    splits = {}
    longest: Counter = Counter()
    for r in results:
        for key, n in r.max_lengths:
            longest[key] = max(longest[key], n)
    for split, split_plan in sorted(plans.items()):
        mine = _in_place_order(results, split)
        if sorted(r.index for r in mine) != list(range(split_plan.num_shards)):
            raise InternalError(f"split {split!r}: expected {split_plan.num_shards} shards, got {len(mine)}")
        classes: Counter = Counter()
        for r in mine:
            classes.update(dict(r.class_counts))
        tfrecords = [Shard(r.name, r.num_records, r.num_bytes, r.crc32c, r.sha256) for r in mine]
        twins = [twin_entry(r) for r in mine] if ARRAY_RECORD.name in config.formats else None
        shards = tfrecords if TFRECORD.name in config.formats else twins or []
        num_records = sum(r.num_records for r in mine)
        splits[split] = Split(
            num_records=num_records, num_bytes=sum(s.num_bytes for s in shards),
            class_counts={name: classes.get(i, 0) for i, name in enumerate(names)},
            shards=shards, array_record_shards=twins if shards is tfrecords else None,
            unlabeled=0 if names else num_records)  # a build is labeled or not as a whole (encode.unlabeled_reject)
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
        num_cores=config.num_cores, num_hosts=config.num_hosts, label_offset=config.label_offset,
        shard_format=first.name, format_version=first.manifest_version)


# ---------------------------------------------------------------------------------------------- the steps


def clear_output(pub: Publication, config: BuildConfig) -> None:
    """Before any shard moves in: a build removes the old manifest, then every dataset file it will not write
    again; an append removes only leftovers of an interrupted earlier append (the old manifest and its files
    stay). Nothing when this run has already published."""
    out = config.output
    if published_by(out, pub.run):
        return
    if not runlock.holds(out, pub.run.run_id):
        raise UsageError(f"output {out}: this run lost its lock to another run (its lease ran out); nothing was "
                         "published")
    keep = pub.new_names
    if pub.grows is None:
        storage.delete(storage.join(out, MANIFEST_NAME))
    else:
        try:
            current = load(out)
        except ManifestError as exc:
            raise UsageError(f"the dataset at {out} cannot be read any more ({exc}); nothing was published") from None
        if current.created != pub.grows.created:
            raise UsageError(f"the dataset at {out} changed while this append ran; nothing was published")
        keep = keep | named_files(pub.grows)
    for name in storage.list_names(out):
        if (is_dataset_file(name) or (pub.grows is None and name in _DATASET_FILES)) and name not in keep:
            storage.delete(storage.join(out, name))


def move_shard(move: Move, config: BuildConfig) -> str:
    """Move one shard into the output (a retry, or a second attempt at once, finds it moved)."""
    storage.rename(move.temp, storage.join(config.output, move.name), size=move.size)
    return move.name


def merge_index(job: IndexJob, config: BuildConfig, run: RunInfo) -> tuple[str, IndexFile]:
    """Write one split's index into the output; (split, its manifest entry). Safe to repeat: the same parts give
    the same bytes, and once the run has published, its entry is read back from the manifest."""
    try:
        return job.split, write_index_file(job, config.output)
    except storage.NotFoundError:
        if published_by(config.output, run):
            found = load(config.output).splits[job.split].index
            if found is not None:
                return job.split, found
        raise


def write_index_file(job: IndexJob, folder: str) -> IndexFile:
    """`job.name` in folder: the index header, the base index's blocks (checked against its manifest entry),
    then the parts' blocks. The parts are read several at a time."""
    idx_schema = index.index_schema(job.extras)
    header = index.index_header(idx_schema)
    base = storage.join(folder, job.base.path) if job.base is not None else None
    if base is not None and (job.base_rows is not None or storage.read_range(base, 0, len(header)) != header):
        return _rewritten_index(job, folder, base, idx_schema)
    digest = storage.Digest()
    with storage.open_write(storage.join(folder, job.name)) as out:
        def put(data: bytes) -> None:
            out.write(data)
            digest.update(data)

        put(header)
        if base is not None:
            _copy_base(base, job.base, header, put)
        for _, data in prefetched(job.parts, storage.read_bytes, lambda _: 0):
            put(index.without_header(data, header))
    return IndexFile(job.name, job.rows + (job.base.num_rows if job.base else 0), digest.size, digest.crc32c,
                     digest.sha256)


def _copy_base(uri: str, entry: IndexFile, header: bytes, put: Callable[[bytes], None]) -> None:
    """The base index's blocks (after its header), its size and CRC32C checked against its manifest entry."""
    seen = storage.Digest()
    with storage.open_read(uri) as f:
        seen.update(f.read(len(header)))  # the header, checked by the caller
        while block := f.read(storage.READ_CHUNK_SIZE):
            seen.update(block)
            put(block)
    if (seen.size, seen.crc32c) != (entry.num_bytes, entry.crc32c):
        raise PlanError(f"{entry.path}: size {seen.size} / crc32c {seen.crc32c} differ from the manifest's "
                        f"{entry.num_bytes} / {entry.crc32c}; the index is damaged (run tpu-shards verify); nothing "
                        "was published")


def _rewritten_index(job: IndexJob, folder: str, base: str, idx_schema) -> IndexFile:
    """The base index's rows (the first `job.base_rows` of them, when given) decoded and written again, then the
    parts': for a base written by another version of the writer, or cut where the replaced generation starts."""
    from shard_utils.format.generations import DigestingReader

    digest = storage.Digest()
    header = index.index_header(idx_schema)

    def rows():
        keep = job.base.num_rows if job.base_rows is None else job.base_rows
        with storage.open_read(base) as raw:
            for i, row in enumerate(index.read_index(DigestingReader(raw, digest), max_rows=job.base.num_rows)):
                if i < keep:
                    yield row
        if (digest.size, digest.crc32c) != (job.base.num_bytes, job.base.crc32c):
            raise PlanError(f"{job.base.path}: size {digest.size} / crc32c {digest.crc32c} differ from the manifest's "
                            f"{job.base.num_bytes} / {job.base.crc32c}; the index is damaged; nothing was published")
        for part in job.parts:
            yield from index.read_index(io.BytesIO(header + index.without_header(storage.read_bytes(part), header)))

    with storage.open_write(storage.join(folder, job.name)) as out:
        written = index.write_index(out, rows(), idx_schema)
    return written.index_file(job.name)


def commit(pub: Publication, config: BuildConfig, indexes: Mapping[str, IndexFile]) -> str:
    """Write the reports and the manifest (last: the switch), then remove the run's temporary data and give the
    lock back; returns the manifest's path. Safe to repeat."""
    out = config.output
    path = storage.join(out, MANIFEST_NAME)
    if not published_by(out, pub.run):
        manifest = with_indexes(pub.manifest, indexes)
        text = manifest.to_json()  # made once: with a million labels each copy is a second
        try:
            parse(text, out)  # the loader's own checks, before anything is published
        except ManifestError as exc:
            raise InternalError(f"the manifest to publish does not validate: {exc}") from None
        if reports_published(pub, out):
            switch(pub, manifest, out, text)
    remove_run_folder(config.temp_root, pub.run.temp_dir)
    runlock.release(out, pub.run.run_id)
    return path


def switch(pub: Publication, manifest: Manifest, out: str, text: str) -> None:
    """The manifest written (TFDS's files, croissant.json and the card before it for a build, after it for an append, with the files only the
    old manifest named removed); `text`: the manifest's JSON."""
    if pub.grows is None:
        for name, data in described_files(manifest, out).items():
            storage.write_bytes(storage.join(out, name), data)
    storage.write_bytes(storage.join(out, MANIFEST_NAME), text.encode("utf-8"))
    if pub.grows is not None:  # the old dataset's TFDS view and the files only it named go now
        for name, data in described_files(manifest, out).items():
            storage.write_bytes(storage.join(out, name), data)
        for name in sorted(named_files(pub.grows) - named_files(manifest)):
            storage.delete(storage.join(out, name))


def reports_published(pub: Publication, out: str) -> bool:
    """Each report composed in the run's temporary folder (beside its pieces), then copied into the output; False
    when another attempt at once published the run meanwhile (and removed the pieces)."""
    for name, report in pub.reports:
        temp = storage.join(pub.run.temp_dir, "report", name)
        try:
            write_report(report, temp, storage.join(pub.run.temp_dir, PIECES_FOLDER))
            storage.copy(temp, storage.join(out, name))
        except storage.NotFoundError:
            if published_by(out, pub.run):
                return False
            raise
    return True


def with_indexes(m: Manifest, indexes: Mapping[str, IndexFile]) -> Manifest:
    """The manifest with the index entries of the splits that got a new one."""
    missing = [name for name, s in m.splits.items() if s.index is None and name not in indexes
               and m.first_format.indexed]
    if missing:
        raise InternalError(f"split {missing[0]!r} has no index")
    splits = {name: replace(s, index=indexes.get(name, s.index)) for name, s in m.splits.items()}
    return replace(m, splits=splits)


def finish(results: Sequence[ShardResult], config: BuildConfig, **kw) -> str:
    """Every publishing step in turn, here (what the Publish step runs in parallel)."""
    pub = plan_publication(results, config, **kw)
    return publish_here(pub, config)


def publish_here(pub: Publication, config: BuildConfig) -> str:
    """Run a publication's steps one after another in this process."""
    clear_output(pub, config)
    for move in pub.moves:
        move_shard(move, config)
    indexes = dict(merge_index(job, config, pub.run) for job in pub.indexes)
    return commit(pub, config, indexes)


def named_files(m: Manifest) -> set[str]:
    """Every file a manifest names: shards, indexes, reports."""
    names = {s.path for split in m.splits.values() for s in split.shards}
    names |= {s.path for split in m.splits.values() for s in split.array_record_shards or ()}
    names |= {split.index.path for split in m.splits.values() if split.index is not None}
    names |= {part["path"] for part in (m.rejected, m.skipped, m.quality or {}) if part.get("path")}
    return names


def is_dataset_file(name: str) -> bool:
    """Whether a name in a dataset folder is one of the job's shards, indexes or reports."""
    return bool(shard_formats.of_shard(name) or INDEX_FILE.match(name)
                or REPORT_FILE.match(name)
                or name in (REJECTED_NAME, SKIPPED_NAME, QUALITY_NAME))
