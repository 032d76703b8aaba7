"""`tpu-shards reshard SRC DST`: a dataset balanced for another TPU topology, from an existing one, never from
the raw media.

    tpu-shards reshard gs://b/ds-8x1 gs://b/ds-8x4 --num-cores 8 --num-hosts 4 [--target-shard-mb M] [--seed S]

The build's write path with another first step: instead of listing and encoding media, each source shard
is streamed and its framed records are copied byte for byte into fragments, with their metadata from the
split's index (`shard_utils.sharding.copy_records`); the shards are planned from the fragments with the
build's layout types (`PlanFragmentShards`), then the build's WriteShards and Publish write and publish
them. Labels (and their ids), features and the accounting (files seen, rejected, skipped, with the reports)
are carried over from the source. A damaged source shard or index
fails the job with one line naming it, and nothing is written.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import posixpath
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions
from apache_beam.transforms.window import GlobalWindows

import shard_utils
from beam_jobs import publish
from beam_jobs.errors import OneLineParser, UsageError
from beam_jobs.jobs import options
from beam_jobs.jobs.checks import check_with_beam, pipeline_options, prepare_output
from beam_jobs.jobs.running import execute, guard_interrupts
from beam_jobs.jobs.summary import counter_totals, summary
from beam_jobs.pipeline.common import count
from beam_jobs.pipeline.fragments import PlanFragmentShards
from beam_jobs.pipeline.publish import Publish
from beam_jobs.pipeline.start import StartRun, keep_lease
from beam_jobs.pipeline.write import WriteShards
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig, RejectLimit
from beam_jobs.run.identity import RunInfo, new_run_id
from beam_jobs.run.tally import Tally
from shard_utils import storage
from shard_utils.errors import PlanError
from shard_utils.format import generations, index, manifest, schema
from shard_utils.format.index import IndexFormatError, IndexRow
from shard_utils.format.manifest import IndexFile, Manifest, Shard
from shard_utils.format.shard_formats import BOTH, FIRST, OPTIONS, TFRECORD, get, option_of
from shard_utils.inputs import listings
from shard_utils.inputs.listings import ListingOptions
from shard_utils.media.encode import Encoded
from shard_utils.sharding import fragments, plan
from shard_utils.sharding.copy_records import DamagedShard, shard_records, unindexed_shard_records
from shard_utils.text import printable_lines

__all__ = [
    "NO_REJECT_LIMIT", "SourceShard", "ListSourceShards", "split_tasks", "CopyRecords", "CarryOver", "carried",
    "SourceFields", "listed_counts", "plan_reshard", "build_reshard_pipeline", "parser", "parse", "source_extras",
    "source_format", "make_config", "load_source", "run", "main"
]

NO_REJECT_LIMIT = RejectLimit(fraction=1.0)  # a reshard rejects nothing; the source's rejects are carried over


@dataclass(frozen=True)
class SourceShard:
    """One source shard to copy: its split, place, manifest entry, and its index rows (None: no index)."""

    split: str
    position: int
    shard: Shard
    rows: tuple[IndexRow, ...] | None


# ---------------------------------------------------------------------------------------------- transforms


class ListSourceShards(beam.PTransform):
    """A SourceShard per source shard, each with its rows of the split's index; tagged `damaged`: why an index
    cannot be used (or the source changed since the job was made: `digest`, the SHA-256 of its manifest's bytes
    then)."""

    def __init__(self, source: Manifest, digest: str):
        super().__init__()
        self.source, self.digest = source, digest

    def expand(self, pbegin):
        return (pbegin
                | "Splits" >> beam.Create(sorted(self.source.splits))
                | "Tasks" >> beam.FlatMap(split_tasks, self.source, self.digest).with_outputs("damaged", main="tasks"))


def split_tasks(split: str, source: Manifest, digest: str):
    """The split's ShardTasks, the index read once, streaming, its rows grouped by shard."""
    path, _ = manifest.manifest_path(source.location)
    try:
        now = manifest.read_manifest_bytes(path)
    except Exception as exc:
        yield beam.pvalue.TaggedOutput("damaged", f"the source's manifest cannot be read: {storage.problem(exc, path)}")
        return
    entry = source.split(split)
    if hashlib.sha256(now).hexdigest() != digest:
        yield beam.pvalue.TaggedOutput("damaged", "the source dataset changed after this job was made")
        return
    if entry.index is None:
        for i, shard in enumerate(entry.shards):
            yield SourceShard(split, i, shard, None)
        return
    try:
        yield from _indexed_tasks(source, split, entry.index)
    except (IndexFormatError, storage.StorageError, DamagedShard) as exc:
        yield beam.pvalue.TaggedOutput("damaged", f"{entry.index.path}: {storage.problem(exc)}")


def _indexed_tasks(source: Manifest, split: str, index_file: IndexFile):
    entry = source.split(split)
    uri = storage.join(source.location, index_file.path)
    digest = storage.Digest()
    rows: list[IndexRow] = []
    shard = 0
    with storage.open_read(uri) as raw:
        for row in index.read_index(generations.DigestingReader(raw, digest), max_rows=index_file.num_rows):
            if row.shard != shard:
                if row.shard != shard + 1 or not rows or shard + 1 >= len(entry.shards):
                    raise DamagedShard(f"a row of shard {row.shard} follows shard {shard}; rows are not in shard order")
                yield SourceShard(split, shard, entry.shards[shard], tuple(rows))
                shard, rows = row.shard, []
            if len(rows) == entry.shards[shard].num_records:
                raise DamagedShard(f"more rows for shard {shard} than its {len(rows)} records")
            rows.append(row)
    if shard != len(entry.shards) - 1 or not rows:
        raise DamagedShard(f"rows end at shard {shard}, the split has {len(entry.shards)} shards")
    if (digest.size, digest.crc32c) != (index_file.num_bytes, index_file.crc32c):
        raise DamagedShard(f"size {digest.size} / crc32c {digest.crc32c} differ from the manifest's "
                           f"{index_file.num_bytes} / {index_file.crc32c}")
    yield SourceShard(split, shard, entry.shards[shard], tuple(rows))


class CopyRecords(beam.PTransform):
    """Copies every record of each source shard into sorted fragments (the encoder's output, without encoding).

    Main output: FragmentInfo; tagged `damaged`: a line naming a shard that does not match its manifest or index.
    """

    def __init__(self, config: BuildConfig, source: Manifest, run):
        super().__init__()
        self.config, self.source, self.run = config, source, run

    def expand(self, tasks):
        return (tasks
                | "Spread" >> beam.Reshuffle()
                | "Copy" >> beam.ParDo(_CopyFn(self.config, self.source.location, self.source.shard_format),
                                       beam.pvalue.AsSingleton(self.run)).with_outputs("damaged", main="fragments"))


class _CopyFn(beam.DoFn):
    def __init__(self, config: BuildConfig, location: str, shard_format: str = FIRST.name):
        self.config, self.location, self.shard_format = config, location, shard_format

    def start_bundle(self):
        self._buffer = fragments.FragmentBuffer(self.config.fragment_bytes)
        self._run: RunInfo | None = None

    def process(self, task: SourceShard, run: RunInfo):
        self._run = keep_lease(run, self.config)
        cfg = self.config
        uri = storage.join(self.location, task.shard.path)
        shard_format = get(self.shard_format)
        records = unindexed_shard_records(uri, task.shard, shard_format, seed=cfg.seed, label_offset=cfg.label_offset,
                                          extras=cfg.listing.extras) if not shard_format.indexed else \
            shard_records(uri, task.shard, task.rows, seed=cfg.seed, label_offset=cfg.label_offset,
                          extras=cfg.listing.extras)
        try:
            for meta, framed in records:
                if self._buffer.add(Encoded(task.split, meta, framed, passed_through=True)):
                    yield from self._flush(self._run)
        except DamagedShard as exc:
            yield beam.pvalue.TaggedOutput("damaged", str(exc))
        count("shards_read")

    def finish_bundle(self):
        if self._run is not None:
            for info in self._flush(self._run):
                yield GlobalWindows.windowed_value(info)

    def _flush(self, run: RunInfo):
        copied = len(self._buffer.records)
        for info in self._buffer.flush(run.temp_dir):
            count("records_copied", copied)
            yield info


class CarryOver(beam.PTransform):
    """The source's accounting, as the build's finish takes it: `rejected` and `skipped_files` (its reports' lines)
    and one `tally`; tagged `damaged` when a report does not match the manifest."""

    def __init__(self, source: Manifest):
        super().__init__()
        self.source = source

    def expand(self, pbegin):
        return (pbegin
                | "Once" >> beam.Create([None])
                | "Read" >> beam.FlatMap(carried, self.source).with_outputs("rejected", "skipped_files", "damaged",
                                                                           main="tally"))


def carried(_, source: Manifest):
    skipped = source.skipped
    yield Tally(seen=source.files_seen, skipped=Counter(skipped.get("by_reason", {})),
                        extensions=Counter(skipped.get("by_extension", {})))
    for tag, part in (("rejected", source.rejected), ("skipped_files", skipped)):
        listed = 0
        try:
            for line in (manifest.read_report(storage.join(source.location, part["path"]), part["path"])
                         if part.get("path") else ()):
                listed += 1
                yield beam.pvalue.TaggedOutput(tag, line)
        except (manifest.ManifestError, storage.StorageError) as exc:
            yield beam.pvalue.TaggedOutput("damaged", str(exc))
            return
        if tag == "rejected" and listed != part.get("count", 0):
            yield beam.pvalue.TaggedOutput("damaged", f"{part.get('path')}: {listed} rejected files listed, the "
                                                      f"manifest says {part.get('count', 0)}")


# ---------------------------------------------------------------------------------------------- finish


@dataclass(frozen=True)
class SourceFields:
    """Turns the manifest the build's finish made into the reshard's: the source's labels, features and
    dataset fields, the new topology in its options."""

    source: Manifest
    new_options: tuple[tuple[str, object], ...]

    def __call__(self, m: Manifest) -> Manifest:
        src = self.source
        made = {**src.options, **dict(self.new_options),
                "resharded_from": {"location": src.location, "created": src.created,
                                   "generations": len(generations.generations_of(src))}}
        splits = {name: replace(split, class_counts=listed_counts(split.class_counts, src.splits[name].class_counts))
                  for name, split in m.splits.items()}
        return replace(m, labels=list(src.labels), splits=splits,
                       features={k: dict(v) for k, v in src.features.items()},
                       image_size=src.image_size, media=src.media, label_offset=src.label_offset,
                       multi_label=src.multi_label, embedding=src.embedding, duplicates=src.duplicates,
                       input=src.input, options=made)


def listed_counts(made: dict[str, int], listed: dict[str, int]) -> dict[str, int]:
    """A split's class counts as the source listed them: a label with no record in the split is named (with 0) only
    where the source's split named it, so that labels no record has do not multiply the manifest by its splits."""
    return {name: n for name, n in made.items() if n or name in listed}


def plan_reshard(results: list, config: BuildConfig, *, failure: list[str], damaged: Sequence[str] = (),
                 source: Manifest, **side) -> publish.Publication:
    """What the reshard publishes, or PlanError in one line: a damaged source, or a plan that cannot be made."""
    if damaged:
        problems = sorted(set(damaged))
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanError(f"source {source.location} is damaged: {problems[0]}{more}; nothing was written "
                             f"(tpu-shards verify {source.location} --deep lists every problem)")
    if failure:
        raise PlanError(f"{failure[0]}; nothing was written")
    new_options = (("num_cores", config.num_cores), ("num_hosts", config.num_hosts), ("tpu", config.tpu),
                   ("target_shard_mb", config.target_shard_mb), ("num_shards", config.num_shards),
                   ("seed", config.seed), ("format", config.format))
    return publish.plan_publication(results, config, failure=[], known_labels=source.labels,
                                    adjust=SourceFields(source, new_options), **side)


# ---------------------------------------------------------------------------------------------- the graph


def build_reshard_pipeline(p: beam.Pipeline, config: BuildConfig, source: Manifest, digest: str) -> None:
    """Add the reshard job to a pipeline (`digest`: the SHA-256 of the source manifest's bytes `source` was read
    from)."""
    run = p | "StartRun" >> StartRun(config)
    light = replace(source, labels=[])  # what the workers need, without the labels only the planner takes
    tasks = p | "ListShards" >> ListSourceShards(light, digest)
    copied = tasks.tasks | "CopyRecords" >> CopyRecords(config, light, run)
    carry = p | "CarryOver" >> CarryOver(light)
    planned = copied.fragments | "PlanShards" >> PlanFragmentShards(config)
    nothing_dropped = p | "NoDuplicates" >> beam.Create([])  # the labels are the source's (known_labels), not found
    shards = planned["tasks"] | "WriteShards" >> WriteShards(config, run, merged=True)
    damaged = (tasks.damaged, copied.damaged, carry.damaged) | "AllDamage" >> beam.Flatten()
    _ = {"shards": shards, "plans": planned["plans"], "failure": planned["failure"], "rejected": carry.rejected,
         "skipped_files": carry.skipped_files, "tally": carry.tally,
         "labels": p | "Labels" >> beam.Create([]), "run": run, "cross_split": nothing_dropped,
         "damaged": damaged} | "Publish" >> Publish(config, planner=functools.partial(plan_reshard, source=source))


# ---------------------------------------------------------------------------------------------- the driver


def parser() -> OneLineParser:
    ap = OneLineParser(
        prog="tpu-shards reshard", allow_abbrev=False,
        description="A new dataset balanced for another TPU topology from an existing one: records are copied byte "
                    "for byte (never re-decoded), reordered by --seed and cut into shards for --num-cores x "
                    "--num-hosts. Beam's own options (--runner, Dataflow options) are passed to Beam.")
    ap.add_argument("src", help="the dataset to reshard (folder or gs://, or its manifest.json)")
    ap.add_argument("dst", help="folder or gs://bucket/prefix for the new dataset")
    ap.add_argument("--num-cores", type=int, help="TPU cores per host (default: the source's)")
    ap.add_argument("--num-hosts", type=int, help="TPU hosts reading the data (default: the source's)")
    ap.add_argument("--target-shard-mb", type=float, help="aim for shards of this size (MB, 10^6; default: the "
                                                          "source's, else 128)")
    ap.add_argument("--num-shards", type=int, help="force this many shards per split (a multiple of cores x hosts)")
    ap.add_argument("--seed", type=int, help="seed of the record order (default: the source's)")
    ap.add_argument("--format", choices=OPTIONS,
                    help="shards of the new dataset: tfrecord, array_record or both (default: the source's); records "
                         "are copied between the formats as they are")
    ap.add_argument("--overwrite", action="store_true", help="replace the dataset already in DST")
    ap.add_argument("--hash-bucket-bits", type=int, default=plan.DEFAULT_BUCKET_BITS, help=argparse.SUPPRESS)
    ap.add_argument("--fragment-mb", type=float, default=64.0, help=argparse.SUPPRESS)
    return ap


def parse(argv: Sequence[str]):
    args, beam_args = options.parse(argv, parser())
    options.check_job_path(args.src, "SRC")
    options.check_job_path(args.dst, "DST")
    options.check_seed(args.seed)
    return args, beam_args


def source_extras(source: Manifest) -> tuple[schema.ExtraSpec, ...]:
    """The source's extra columns, in the order its build gave them (else from its feature table)."""
    given = source.options.get("extra_columns") or []
    if given:
        try:
            return listings.parse_extra_columns(",".join(given))
        except (ValueError, TypeError):
            pass
    return tuple(schema.ExtraSpec(k[len(schema.EXTRA_PREFIX):], v["dtype"], v.get("shape") == [schema.VARIABLE])
                 for k, v in source.features.items() if k.startswith(schema.EXTRA_PREFIX))


def source_format(source: Manifest) -> str:
    """The --format that built the source: tfrecord, array_record or both."""
    return option_of(source.formats)


def make_config(args, source: Manifest, *, temp_root: str, run_id: str | None, created: str | None,
                local: bool) -> BuildConfig:
    """The reshard's settings, checked; UsageError naming the option."""
    cores = args.num_cores if args.num_cores is not None else source.num_cores
    hosts = args.num_hosts if args.num_hosts is not None else source.num_hosts
    for name, value in (("--num-cores", cores), ("--num-hosts", hosts)):
        if not 1 <= value <= 65536:
            raise UsageError(f"{name} must be in 1..65536")
    unit = cores * hosts
    if args.num_shards is not None and (args.num_shards < 1 or args.num_shards % unit):
        raise UsageError(f"--num-shards {args.num_shards} must be a positive multiple of num_cores x num_hosts = "
                         f"{unit}")
    target = args.target_shard_mb if args.target_shard_mb is not None else float(
        source.options.get("target_shard_mb") or 128.0)
    if not 0 < target <= 100_000:
        raise UsageError("--target-shard-mb must be more than 0 and at most 100000")
    if not 0 <= args.hash_bucket_bits <= 20 or not 0 < args.fragment_mb <= 4096:
        raise UsageError("--hash-bucket-bits must be in 0..20 and --fragment-mb in (0, 4096]")
    extension = TFRECORD.extension_of(posixpath.basename(next(iter(source.splits.values())).shards[0].path))
    shard_format = args.format or source_format(source)
    options.check_format(shard_format, extension if extension and shard_format == BOTH else TFRECORD.extensions[0],
                         None if args.format else f"resharding a dataset of --format {shard_format}")
    # its records are read from its own shards (ArrayRecord ones need the extra), whatever it becomes
    source.first_format.check_installed(f"resharding a dataset of --format {source.shard_format}")
    return BuildConfig(
        input=source.location, output=args.dst, temp_root=temp_root, run_id=run_id, created=created,
        splits=(), num_cores=cores, num_hosts=hosts,
        tpu=source.tpu if (cores, hosts) == (source.num_cores, source.num_hosts) else None,  # no stale --tpu
        target_shard_mb=target, num_shards=args.num_shards,
        seed=args.seed if args.seed is not None else int(source.options.get("seed") or 0),
        tool_version=shard_utils.__version__, label_offset=source.label_offset,
        shard_extension=extension or TFRECORD.extensions[0], max_rejected=NO_REJECT_LIMIT, format=shard_format,
        bucket_bits=args.hash_bucket_bits, fragment_bytes=int(args.fragment_mb * 2**20), overwrite=args.overwrite,
        listing=ListingOptions(extras=source_extras(source)), local=local)


def load_source(src: str) -> tuple[Manifest, str]:
    """The source's manifest and the SHA-256 of the bytes it was parsed from (a worker compares its own read with
    it instead of parsing the manifest again)."""
    read: list[bytes] = []

    def keep(path: str) -> bytes:
        read.append(manifest.read_manifest_bytes(path))
        return read[-1]

    source = manifest.load(src, reader=keep)
    return source, hashlib.sha256(read[-1]).hexdigest()


def run(argv: Sequence[str] | None = None) -> Manifest | None:
    """Run the reshard; returns the new manifest (None when only a Dataflow template was written)."""
    args, beam_args = parse(list(sys.argv[1:] if argv is None else argv))
    opts = pipeline_options(beam_args)
    runner = opts.view_as(StandardOptions).runner or ""
    cloud = opts.view_as(GoogleCloudOptions)
    source, digest = load_source(args.src)
    template = cloud.template_location
    now = datetime.datetime.now(datetime.UTC)
    run_id = None if template else new_run_id(now)
    local = runner in options.LOCAL_RUNNERS and not template
    config = make_config(args, source, temp_root=claim.temp_root_for(args.dst, cloud.temp_location),
                         run_id=run_id, created=None if template else now.isoformat(timespec="seconds"), local=local)
    check_with_beam(opts)
    with guard_interrupts(config, local):
        created = prepare_output(config)
        started = time.monotonic()
        result = execute(config, opts, lambda p: build_reshard_pipeline(p, config, source, digest),
                         created_output=created)
        if result is None:
            return None
        built = manifest.load(args.dst)
        print(printable_lines(summary(built, time.monotonic() - started, runner).replace(
            " wrote ", " resharded " + source.location + " into ", 1)))
        totals = counter_totals(result)
        if totals.get("records_copied"):
            print(f"  counters: shards_read {totals.get('shards_read', 0)}, records_copied {totals['records_copied']}")
    return built


def main(argv: Sequence[str] | None = None) -> int:
    from beam_jobs.errors import guarded

    return guarded(run, argv)


if __name__ == "__main__":
    sys.exit(main())
