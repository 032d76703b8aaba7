"""`tpu-shards build --append`: add the files that are new since the last build as a new generation of shards.

    tpu-shards build --append --input DIR|gs://... --output DATASET [the first build's options]

The graph is the build's, with one step more before encoding and a different finish:

    list ──► keep new ──► encode ──► near-duplicates with the dataset's ──► plan ──► write ──► publish a generation
             (anti-join on source id with the dataset's index and reports)

A file is new when no record, rejection or listed skip of the dataset has its source id. New records join
the near-duplicate clusters of the dataset's (signatures and SHA-256s from the index): with --dedup a new
file whose bytes equal a record's is rejected `duplicate`; with --near-dups group a near-duplicate of a
record goes to that record's split, with drop it is rejected `near_duplicate`. A dataset of
ArrayRecord shards only has no index: its records' own fields name them (each shard read once). Existing shards
are never rewritten: see `beam_jobs.publish.append` for how the new generation is published and
`shard_utils.format.generations` for its names.
"""
from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Collection
from dataclasses import dataclass, replace

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, StandardOptions

from beam_jobs import progress
from beam_jobs.errors import UsageError
from beam_jobs.jobs import inherit, options
from beam_jobs.jobs.checks import check_with_beam, inside, pipeline_options, prepare_inputs
from beam_jobs.jobs.running import execute, guard_interrupts
from beam_jobs.jobs.summary import counted, counter_totals, label_ids_line, shard_noun, shards_of, twins_line
from beam_jobs.pipeline.common import count
from beam_jobs.pipeline.dataset import ShardMedia
from beam_jobs.pipeline.listing import LIST_CHUNK, DistinctLabels, ListListedMedia, ListMedia
from beam_jobs.pipeline.near_dups import packed, signature_of
from beam_jobs.pipeline.publish import Publish
from beam_jobs.pipeline.start import StartRun
from beam_jobs.publish.append import append_naming, batch_with_generation, plan_append, with_generation
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import new_run_id
from beam_jobs.run.tally import Tally
from shard_utils import inputs, storage
from shard_utils.errors import InternalError
from shard_utils.format import index, manifest, schema, shard_formats
from shard_utils.format.filenames import generation_split
from shard_utils.format.generations import next_generation
from shard_utils.format.tfrecord import FramingError
from shard_utils.format.topology import cores_x_hosts
from shard_utils.quality.clusters import Member
from shard_utils.read.verify import check_cheap
from shard_utils.storage import lock as runlock
from shard_utils.text import printable, printable_lines

__all__ = [
    "AppendConfig", "ReadDataset", "DatasetPart", "dataset_parts", "read_part", "ROWS_CHECKED_PER_SPLIT",
    "dataset_member", "KeepNew", "keep_new", "build_append_pipeline", "check_appendable", "check_intact",
    "open_dataset", "recorded_options", "run_append", "append_summary"
]


class AppendConfig(BuildConfig):
    """A build's config for an append: a split that gets no new records is fine (it keeps its shards)."""

    @property
    def splits_from_data(self) -> bool:
        return True


# ---------------------------------------------------------------------------------------------- transforms


class ReadDataset(beam.PTransform):
    """The source ids the dataset already accounts for: ("id", kind) for its records (from each split's index),
    rejected files and listed skipped files; tagged `members`: (packed signature or None, Member) of every
    record, for the near-duplicate clusters (`near_dups.FindNearDuplicates`)."""

    def __init__(self, dataset: manifest.Manifest):
        super().__init__()
        self.parts = dataset_parts(dataset)

    def expand(self, pbegin):
        return (pbegin
                | "Parts" >> beam.Create(self.parts)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(read_part).with_outputs("members", main="ids"))


@dataclass(frozen=True)
class DatasetPart:
    """One file that names source ids of the dataset: an index (with its split's shards, to check rows against),
    an ArrayRecord shard, or a report."""

    kind: str  # record (an index), a shard format (its shards, read whole: array_record), rejected or skipped
    uri: str
    split: str = ""
    rows: int = 0  # an index's row count, as the manifest says
    shards: tuple[tuple[str, int], ...] = ()  # an index's split: (uri, num_bytes) of each shard
    label_offset: int = 0


def dataset_parts(m: manifest.Manifest) -> list[DatasetPart]:
    """Every file that names the dataset's source ids."""
    if not m.first_format.indexed:  # its shards are read whole: the records carry the ids
        parts = [DatasetPart(m.shard_format, storage.join(m.location, shard.path), name)
                 for name, s in m.splits.items() for shard in s.shards]
    else:
        parts = [_indexed_part(m, name, s) for name, s in m.splits.items()]
    for kind, part in (("rejected", m.rejected), ("skipped", m.skipped)):
        if part.get("path") and part.get("count"):
            parts.append(DatasetPart(kind, storage.join(m.location, part["path"])))
    return parts


def _indexed_part(m: manifest.Manifest, name: str, s: manifest.Split) -> DatasetPart:
    """A TFRecord split's index, as the part naming its source ids (check_appendable refused a split without)."""
    if s.index is None:
        raise InternalError(f"split {name!r} has no record index; check_appendable refuses such a dataset")
    return DatasetPart("record", storage.join(m.location, s.index.path), name, s.index.num_rows,
                       tuple((storage.join(m.location, shard.path), shard.num_bytes) for shard in s.shards),
                       m.label_offset)


def read_part(part: DatasetPart):
    """The source ids one file of the dataset names; a damaged file is a ManifestError naming it."""
    uri = part.uri
    try:
        if part.kind == "record":
            yield from _index_ids(part)
        elif part.kind in shard_formats.FORMATS:
            yield from _record_ids(shard_formats.get(part.kind), uri, part.split)
        else:
            yield from ((entry["source"], part.kind) for entry in manifest.read_report(uri, uri))
    except (index.IndexFormatError, storage.StorageError, ValueError) as exc:  # a broken shard: ValueError
        raise manifest.ManifestError(f"cannot append to a damaged dataset: {uri}: {storage.problem(exc, uri)}; "
                                     "tpu-shards verify lists every problem") from None


ROWS_CHECKED_PER_SPLIT = 64  # index rows whose records an append reads to check them (the first of spread shards)


def _index_ids(part: DatasetPart):
    """The source ids (and SHA-256s) an index gives, each row checked to lie inside its shard, and the first row
    of up to ROWS_CHECKED_PER_SPLIT shards spread over the split checked against its record (one ranged read
    each): an index whose ids or labels are not its records' is refused, not trusted."""
    step = max(1, -(-len(part.shards) // ROWS_CHECKED_PER_SPLIT))
    with storage.open_read(part.uri) as f:
        for i, row in enumerate(index.read_index(f, max_rows=part.rows)):
            if not 0 <= row.shard < len(part.shards):
                raise ValueError(f"row {i}: shard {row.shard} is not one of the split's {len(part.shards)} shards")
            shard_uri, shard_bytes = part.shards[row.shard]
            bad = index.check_place(row.offset, row.length, shard_bytes)
            if bad:
                raise ValueError(f"row {i}: {bad} ({storage.basename(shard_uri)})")
            if row.offset == 0 and (row.shard % step == 0 or row.shard == len(part.shards) - 1):
                _check_row(row, shard_uri, part.label_offset)
            yield row.source_id, "record"
            yield beam.pvalue.TaggedOutput("members", dataset_member(row.source_id, part.split, row.labels,
                                                                     row.sha256, signature_of(row.phash)))


def _check_row(row: index.IndexRow, shard_uri: str, label_offset: int) -> None:
    """ValueError naming the shard when a row's record is not where it says or not the record it describes (a
    record whose data fails its checksum is the shard's damage, not the row's: the copy that reads it or `verify`
    says so, as before)."""
    try:
        record = index.unframe(storage.read_range(shard_uri, row.offset, row.length))
    except FramingError as exc:
        if str(exc) == index.DATA_CHECKSUM_MISMATCH:
            return
        raise ValueError(f"{storage.basename(shard_uri)} record 0: no record where its index row says: {exc}") from None
    disagrees = index.identity_problem(row, record, label_offset)
    if disagrees:
        raise ValueError(f"{storage.basename(shard_uri)} record 0: {disagrees}")


def dataset_member(source_id: str, split: str, labels, sha256: str, signature: int | None):
    """(packed signature or None, Member) of a record already in the dataset."""
    return (None if signature is None else packed(signature),
            Member(source_id, split, tuple(labels), None, sha256))


def _record_ids(shard_format: shard_formats.ShardFormat, uri: str, split: str):
    """The source ids (and SHA-256s: the records carry no signature) a shard's records carry (a dataset of
    ArrayRecord shards, which has no index)."""
    for data in shard_format.read(uri):
        fields = schema.decode_lists(data)
        source_id = b"".join(fields.get(schema.SOURCE_ID, [])).decode("utf-8", "replace")
        yield source_id, "record"
        sha = b"".join(fields.get(schema.SHA256, [])).decode("utf-8", "replace")
        yield beam.pvalue.TaggedOutput("members", dataset_member(source_id, split, (), sha, None))


class KeepNew(beam.PTransform):
    """The listed media, rejects and skipped files whose source id the dataset does not account for yet.

    Input: a dict with `ids` (from ReadDataset) and the lister's `media`, `rejected`, `skipped_files`.
    Outputs: `media` (chunks of new MediaItems), `rejected`, `skipped_files`, `tally` (this generation's
    files seen: the new ones only) and `present` (counts of files already in the dataset).
    """

    def expand(self, listed):
        keyed = {
            "old": listed["ids"],
            "item": listed["media"] | "Items" >> beam.FlatMap(lambda chunk: ((i.source_id, i) for i in chunk)),
            "rejected": listed["rejected"] | "KeyRejects" >> beam.Map(lambda r: (r["source"], r)),
            "skipped": listed["skipped_files"] | "KeySkips" >> beam.Map(lambda s: (s["source"], s)),
        }
        out = (keyed | "BySourceId" >> beam.CoGroupByKey()
               | "New" >> beam.FlatMap(keep_new).with_outputs("rejected", "skipped_files", "tally", "present",
                                                             main="media"))
        media = out.media | "Chunk" >> beam.BatchElements(min_batch_size=LIST_CHUNK, max_batch_size=LIST_CHUNK)
        return {"media": media, "rejected": out.rejected, "skipped_files": out.skipped_files, "tally": out.tally,
                "present": out.present}


def keep_new(grouped):
    """Everything listed under one source id: passed on if the dataset does not know the id, else counted."""
    _, found = grouped
    items, rejects, skips = list(found["item"]), list(found["rejected"]), list(found["skipped"])
    n = len(items) + len(rejects) + len(skips)
    if not n:
        return
    if any(True for _ in found["old"]):
        count("already_in_dataset", n)
        progress.expect("encode", -len(items))  # the lister expected them to be encoded
        yield beam.pvalue.TaggedOutput("present", n)
        return
    tally = Tally(seen=n)
    for s in skips:
        tally.skip(s["reason"], inputs.extension_of(s["source"]))
        yield beam.pvalue.TaggedOutput("skipped_files", s)
    yield beam.pvalue.TaggedOutput("tally", tally)
    for r in rejects:
        yield beam.pvalue.TaggedOutput("rejected", r)
    yield from items


# ---------------------------------------------------------------------------------------------- the graph


def build_append_pipeline(p: beam.Pipeline, config: BuildConfig, old: manifest.Manifest) -> None:
    """Add the append job to a pipeline: the build's steps, fed only the new files."""
    run = p | "StartRun" >> StartRun(config)
    lister = ListListedMedia(config) if config.uses_listing else ListMedia(config)
    listed = p | "ListMedia" >> lister
    dataset = p | "ReadDataset" >> ReadDataset(old)
    fresh = {"ids": dataset.ids, "media": listed["media"], "rejected": listed["rejected"],
             "skipped_files": listed["skipped_files"]} | "KeepNew" >> KeepNew()
    labels = fresh["media"] | "DistinctLabels" >> DistinctLabels()
    sharded = fresh["media"] | "ShardMedia" >> ShardMedia(
        config, labels, run, append_naming(old, config), known_labels=tuple(old.labels),
        existing=dataset.members, grows=replace(old, labels=[]))  # its labels: known_labels, once
    g = next_generation(old)
    rejected = ((fresh["rejected"], sharded["rejected"]) | "AllRejected" >> beam.Flatten()
                | "RejectedOfGeneration" >> beam.Map(with_generation, g))
    skipped = fresh["skipped_files"] | "SkippedOfGeneration" >> beam.Map(with_generation, g)
    _ = {"shards": sharded["shards"], "plans": sharded["plans"], "failure": sharded["failure"], "rejected": rejected,
         "skipped_files": skipped, "tally": fresh["tally"], "labels": labels, "run": run,
         "cross_split": sharded["cross_split"], "present": fresh["present"], "encoded": sharded["encoded"],
         "quality": sharded["quality"] | "QualityOfGeneration" >> beam.Map(batch_with_generation, g)} \
        | "Publish" >> Publish(config, planner=functools.partial(plan_append, old=old))


# ---------------------------------------------------------------------------------------------- the driver


def check_appendable(old: manifest.Manifest, config: BuildConfig, given: Collection[str] = ()) -> None:
    """Refuse, with one line, a dataset this append cannot grow, or options (`given`: the ones on the command
    line) that differ from its first build's."""
    where = f"cannot append to {config.output}"
    if old.media != "image" or old.embedding is not None:
        raise UsageError(f"{where}: appending supports image datasets without embeddings")
    inherit.check_same(old.options, config.manifest_options(), given, where)
    if shard_formats.formats_of(config.format) != old.formats:
        raise UsageError(f"{where}: it holds {' and '.join(old.formats)} shards, this append asks for --format "
                         f"{config.format}; give --format {old.options.get('format') or _format_of(old)}")
    missing = [name for name, s in old.splits.items() if s.index is None and old.first_format.indexed]
    if missing:
        raise UsageError(f"{where}: split {missing[0]!r} has no record index (an older tpu-shards built it); reshard "
                         "it into a new folder (tpu-shards reshard SRC DST writes one) and append there")
    if (config.num_cores, config.num_hosts) != (old.num_cores, old.num_hosts):
        raise UsageError(f"{where}: it is sharded for {cores_x_hosts(old.num_cores, old.num_hosts)}, this append asks "
                         f"for {cores_x_hosts(config.num_cores, config.num_hosts)}; leave --tpu, --num-cores and "
                         "--num-hosts out to take the dataset's (tpu-shards reshard changes them)")
    g = next_generation(old)
    for name in old.splits:
        if generation_split(name, g) in old.splits:
            raise UsageError(f"{where}: split {generation_split(name, g)!r} is also the name of generation {g} of "
                             f"split {name!r}")


def _format_of(m: manifest.Manifest) -> str:
    return shard_formats.option_of(m.formats)


def check_intact(old: manifest.Manifest, config: BuildConfig) -> None:
    """Refuse, with the first finding in one line, a dataset whose shards or indexes are not what its manifest
    says (verify's checks that read no shard: see `verify.check_cheap`)."""
    problems = check_cheap(old)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise UsageError(f"cannot append to {config.output}: it is damaged: {problems[0]}{more}; tpu-shards verify "
                         "lists every problem; nothing was written")


def open_dataset(config: BuildConfig, given: Collection[str] = ()) -> manifest.Manifest:
    """Take the output's lock and load the dataset to grow; UsageError (lock given back) when it cannot be grown."""
    out, run_id = config.output, config.run_id
    if run_id is None:
        raise InternalError("an append decides its run id before it opens the dataset")
    if config.input and inside(out, config.input):
        raise UsageError(f"output {out} is inside the input {config.input}; choose another place")
    try:
        present = storage.exists(storage.join(out, manifest.MANIFEST_NAME))
    except storage.StorageError as exc:
        raise UsageError(f"cannot read output {out}: {exc.reason}") from None
    if not present:
        raise UsageError(f"--append: there is no dataset at {out} (no {manifest.MANIFEST_NAME}); build it first "
                         "without --append")
    try:
        claim.take(out, run_id, config.created or "")
    except storage.StorageError as exc:
        raise UsageError(f"output {out} is not writable: {exc.reason}") from None
    try:
        try:
            old = manifest.load(out)
        except manifest.ManifestError as exc:
            raise UsageError(f"cannot append to {out}: {exc}") from None
        check_appendable(old, config, given)
        check_intact(old, config)
        claim.clear_leftovers(out, config.temp_root, run_id)
    except BaseException:
        runlock.release(out, run_id)
        raise
    return old


def recorded_options(output: str) -> dict:
    """The options the dataset at `output` records (none when there is no readable dataset there: opening it
    says why, under the lock)."""
    try:
        return manifest.load(output).options
    except (manifest.ManifestError, storage.StorageError):
        return {}


def run_append(args, beam_args, given: Collection[str] = ()) -> manifest.Manifest:
    """The driver of `build --append` (options already parsed by `build.run`; `given`: the options its command
    line gives, the others are taken from the dataset's manifest); returns the manifest after."""
    opts = pipeline_options(beam_args)
    runner = opts.view_as(StandardOptions).runner or ""
    cloud = opts.view_as(GoogleCloudOptions)
    if cloud.template_location:
        raise UsageError("--append cannot be made into a classic Dataflow template (it reads the dataset when it "
                         "starts); run it directly, or as a Flex Template")
    if args.overwrite:
        raise UsageError("--append adds to the dataset in --output and --overwrite replaces it; give one of them")
    direct = opts.view_as(DirectOptions)
    workers = options.build_workers(args, runner, direct)
    args = inherit.take_recorded(args, set(given), recorded_options(args.output))
    listing, split_dirs = prepare_inputs(args)
    now = datetime.datetime.now(datetime.UTC)
    local = runner in options.LOCAL_RUNNERS
    base = options.make_config(
        args, split_dirs, workers=workers, temp_root=claim.temp_root_for(args.output, cloud.temp_location),
        run_id=new_run_id(now), created=now.isoformat(timespec="seconds"), listing=listing, local=local)
    config = AppendConfig(**{name: getattr(base, name) for name in base.__dataclass_fields__})
    check_with_beam(opts)
    with guard_interrupts(config, local):
        old = open_dataset(config, given)
        started = time.monotonic()
        result = execute(config, opts, lambda p: build_append_pipeline(p, config, old), show_progress=args.progress)
        after = manifest.load(args.output)
    seconds = time.monotonic() - started
    totals = counter_totals(result)
    if after.created == old.created:
        dups = totals.get("rejected_duplicate", 0)
        also = f", {dups} more have the bytes of a record in it" if dups else ""
        print(f"tpu-shards: nothing to append: no media file is new to {printable(args.output)} "
              f"({totals.get('already_in_dataset', 0)} already in it{also}); the dataset is unchanged")
        return after
    print(printable_lines(append_summary(after, seconds)))
    return after


def append_summary(m: manifest.Manifest, seconds: float) -> str:
    """A few lines on the generation just added."""
    assert m.generations  # the append has just added one
    g = m.generations[-1]
    lines = [f"tpu-shards: appended generation {g.generation} to {m.location} in {seconds:.1f}s"]
    for name, n in g.num_records.items():
        mine = [s for s in m.splits[name].shards if s.generation == g.generation]
        carried = g.carried.get(name, 0)
        joined = (f" together with the {counted(carried, 'record')} of its latest generation (too few new records "
                  "for shards of their own; copied, not decoded)" if carried else "")
        lines.append(f"  {name}: {counted(n, 'new record')}{joined} in {shards_of(m, mine)}; the split now has "
                     f"{counted(m.splits[name].num_records, 'record')} in "
                     f"{counted(len(m.splits[name].shards), shard_noun(m))}")
        lines += twins_line([t for t in m.splits[name].array_record_shards or () if t.generation == g.generation])
    lines.append(f"  new files {g.files_seen}: rejected {g.rejected}, skipped {g.skipped}; {g.already_in_dataset} "
                 "files were already in the dataset")
    if g.labels_added:
        first = len(m.labels) - len(g.labels_added)
        lines.append("  new labels: " + ", ".join(f"{name} (id {first + i})" for i, name in enumerate(g.labels_added)))
        lines += label_ids_line(m.labels)
    if g.rejected:
        lines.append(f"  see {storage.join(m.location, m.rejected['path'])} for why each file was rejected")
    return "\n".join(lines)
