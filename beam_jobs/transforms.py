"""The composite PTransforms of the shard-building job, one per step of the data flow.

Elements are batches, not images: a chunk of listed files, a fragment of a few hundred encoded
records, a slice of a fragment for one shard. Beam's per-element cost is paid per batch, and the
encoded bytes never travel through a shuffle: encoders write sorted fragments, and each shard
writer reads exactly its own byte range of each fragment.
"""
from __future__ import annotations

import dataclasses
import datetime
import pickle
import uuid
from typing import Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from shard_utils import fragments, plan, storage, write_once
from shard_utils.encode import EncodeSettings, Encoded, Prepared, encode_batch, framed, reject
from shard_utils.generations import label_order
from shard_utils.inputs import MediaItem
from shard_utils.listings import ListingOptions

from . import media_listing, progress, publish
from .config import BuildConfig, RunInfo
from .errors import UsageError
from .listing_io import DropDuplicateRows, ListingItems, read_all_rows
from . import shard_writer
from . import encode_worker
from .encode_worker import EncodeTally
from .local_pool import LocalPool
from .media_listing import LIST_CHUNK
from .publish import crash_point

NAMESPACE = "tpu_shards"
FAILURE_METRIC = "failure"  # a local build that cannot publish says why here (see publish_or_fail)
TASK_ITEMS = 16  # items per task handed to a local worker process


def count(name: str, n: int = 1) -> None:
    Metrics.counter(NAMESPACE, name).inc(n)


def _rejected(entry: dict) -> beam.pvalue.TaggedOutput:
    count(f"rejected_{entry['reason']}")
    return beam.pvalue.TaggedOutput("rejected", entry)


# ---------------------------------------------------------------------------------------------- run


class StartRun(beam.PTransform):
    """One RunInfo: the run's id, temporary folder and creation time.

    A driver decides these before submitting and holds the output's lock; a template launch has no
    driver, so the job decides them here, when it runs, and takes the lock itself.
    """

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        return pbegin | "Once" >> beam.Create([None]) | "Decide" >> beam.Map(lambda _: start_run(self.config))


def start_run(config: BuildConfig) -> RunInfo:
    """The RunInfo of this run; for a template launch, a new one, with the lock and the overwrite rule checked."""
    if config.run_id:
        return RunInfo(config.run_id, config.temp_dir(config.run_id), config.created or "")
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = new_run_id(now)
    created = now.isoformat(timespec="seconds")
    publish.check_output_at_launch(config, run_id, created)
    return RunInfo(run_id, config.temp_dir(run_id), created)


def new_run_id(now: datetime.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


# ---------------------------------------------------------------------------------------------- list


class ListMedia(beam.PTransform):
    """Streams the files under the input in chunks and sorts them into media, skipped and rejected.

    Outputs: `media` (list[MediaItem], a chunk), `rejected` (dict), `skipped_files` (dict naming a
    non-media file), `tally` (publish.Tally per chunk: files seen and skipped by reason), `labels`
    (each label name once). Locally the labels come from a second, cheap walk, so the media stream
    into the encode step instead of waiting, all in memory, for the label set, and with worker processes
    both walks began in them while Beam built the graph (media_listing.start_early); on Dataflow the
    chunks are reshuffled over the workers and the labels are those of the media.
    """

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        cfg = self.config
        root = pbegin | "Root" >> beam.Create([cfg.input])
        outputs = ("rejected", "skipped_files", "tally")
        if cfg.local:
            out = root | "Walk" >> beam.FlatMap(walk_here_or_early, cfg).with_outputs(*outputs, main="media")
            labels = (pbegin  # a root of its own: sharing the media's would stop Beam fusing their stage
                      | "LabelsRoot" >> beam.Create([cfg.input])
                      | "WalkForLabels" >> beam.FlatMap(labels_here_or_early, cfg))
        else:
            out = (root
                   | "Walk" >> beam.FlatMap(media_listing.walk_chunks, cfg.follow_symlinks)  # list[storage.Entry]
                   | "Spread" >> beam.Reshuffle()
                   | "Classify" >> beam.FlatMap(classify_chunk, cfg.split_dirs, cfg.input, cfg.listing,
                                                cfg.video is not None).with_outputs(*outputs, main="media"))
            labels = out.media | "DistinctLabels" >> DistinctLabels()
        return {"media": out.media, "rejected": out.rejected, "skipped_files": out.skipped_files, "tally": out.tally,
                "labels": labels}


def classify_chunk(entries: list[storage.Entry], split_dirs: bool, root: str, options: ListingOptions,
                   video: bool = False):
    """A chunk of walked entries -> one list of MediaItems, plus tagged rejects, skipped names and a tally."""
    yield from sorted_outputs(media_listing.sort_chunk(entries, split_dirs, root, options, video))


def walk_here_or_early(root: str, config: BuildConfig):
    """ListMedia's outputs for every chunk under root: from the walk a worker began early, else walked here."""
    early = media_listing.take_early(config, "media")
    if early is None:
        for chunk in media_listing.walk_chunks(root, config.follow_symlinks):
            yield from sorted_outputs(media_listing.sort_chunk(chunk, config.split_dirs, root, config.listing,
                                                              config.video is not None))
        return
    for chunk in handed_over(early):
        yield from sorted_outputs(chunk)


def handed_over(chunks: list) -> Iterator:
    """The chunks in order, each let go of (emptying the list) as the next step takes it: a listing taken
    from a worker is not held twice."""
    chunks.reverse()
    while chunks:
        yield chunks.pop()


def labels_here_or_early(root: str, config: BuildConfig) -> list[str]:
    """The labels under root: from the walk for labels a worker began early, else walked here."""
    early = media_listing.take_early(config, "labels")
    return early if early is not None else media_listing.walked_labels(
        root, config.follow_symlinks, config.split_dirs, config.listing, config.video is not None)


def sorted_outputs(found: media_listing.SortedChunk):
    """A sorted chunk as ListMedia's outputs: tagged rejects, skipped names and tally, then its media."""
    tally = publish.Tally(seen=found.seen)
    count("files_matched", found.seen)
    progress.advance("list", found.seen)
    for entry in found.rejected:
        yield _rejected(entry)
    for source, reason, extension in found.skipped:
        count(f"skipped_{reason}")
        tally.skip(reason, extension)
        if reason in ("not_media", "still_image"):
            yield beam.pvalue.TaggedOutput("skipped_files", {"source": source, "reason": reason})
    yield beam.pvalue.TaggedOutput("tally", tally)
    if found.media:
        progress.expect("encode", len(found.media))
        yield found.media


class ListListedMedia(beam.PTransform):
    """The media a --listing names (the input is not walked): one item per row, a row naming a file again
    rejected `duplicate_row`; same outputs as ListMedia (every row is seen once).

    On Dataflow the rows come from a splittable source per listing and meet their duplicates in a shuffle
    keyed by file. A local build reads them in one step (`listed_here_or_early`), which also gives the
    labels: as Beam elements, one per row through several steps, they cost 0.35 s per 4,000 rows before
    the first file could be encoded."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        if self.config.local:  # read in this process: one element per chunk, not several per row
            out = (pbegin
                   | "Root" >> beam.Create([None])
                   | "ReadAll" >> beam.FlatMap(listed_here_or_early, self.config).with_outputs(
                       "rejected", "tally", "labels", "skipped_files", main="media"))  # no skipped files
            return {"media": out.media, "rejected": out.rejected, "skipped_files": out.skipped_files,
                    "tally": out.tally, "labels": out.labels}
        rows = pbegin | "ListingItems" >> ListingItems(self.config.listing, self.config.input)
        unique = rows.items | "DropDuplicateRows" >> DropDuplicateRows()  # MediaItem
        seen = ((rows.items, rows.rejected) | "AllRows" >> beam.Flatten()
                | "CountRows" >> beam.combiners.Count.Globally()
                | "Tally" >> beam.Map(lambda n: publish.Tally(seen=n)))
        media = (unique.items
                 | "Chunk" >> beam.BatchElements(min_batch_size=LIST_CHUNK, max_batch_size=LIST_CHUNK)
                 | "CountChunk" >> beam.Map(_listed_chunk))
        rejected = ((rows.rejected, unique.rejected) | "AllRowRejects" >> beam.Flatten()
                    | "CountRejects" >> beam.Map(lambda r: _rejected(r).value))
        nothing = pbegin | "NoSkippedFiles" >> beam.Create([])
        labels = media | "DistinctLabels" >> DistinctLabels()
        return {"media": media, "rejected": rejected, "skipped_files": nothing, "tally": seen, "labels": labels}


def listed_here_or_early(_, config: BuildConfig):
    """Every row of the listings as ListListedMedia's outputs, read and de-duplicated here (or taken from a
    worker that read them early): chunks of MediaItems, tagged rejects (bad rows, rows naming a file
    again), one tally of the rows seen, and each label name once (what DistinctLabels would give)."""
    found = media_listing.take_early(config, "media")
    if found is None:
        rows = read_all_rows(config.listing.listings, config.listing.format)
        found = media_listing.items_of_rows(rows, config.listing, config.input)
    for entry in found.rejected:
        yield _rejected(entry)
    yield beam.pvalue.TaggedOutput("tally", publish.Tally(seen=found.seen))
    for name in sorted({name for chunk in found.chunks for item in chunk for name in item.labels}):
        yield beam.pvalue.TaggedOutput("labels", name)
    for chunk in handed_over(found.chunks):
        yield _listed_chunk(chunk)


def _listed_chunk(chunk: list[MediaItem]) -> list[MediaItem]:
    count("files_matched", len(chunk))
    progress.advance("list", len(chunk))
    progress.expect("encode", len(chunk))
    return chunk


class DistinctLabels(beam.PTransform):
    """The label names of all media, each once (a side input of the encoder)."""

    def expand(self, media):
        return (media
                | "LabelsOf" >> beam.FlatMap(lambda chunk: {name for item in chunk for name in item.labels})
                | "Distinct" >> beam.Distinct())


# ---------------------------------------------------------------------------------------------- encode


class EncodeMedia(beam.PTransform):
    """Reads, validates and encodes every item into framed tf.Examples, written as sorted fragments.

    Main output: FragmentInfo; tagged `rejected`: dicts for items that are not usable media; with an
    embedding model, records are not framed here but go out tagged `prepared` (encode.Prepared) to
    EmbedRecords. Locally the work runs in a pool of `config.workers` processes; on Dataflow inline.
    `known_labels` (an append: the dataset's labels) keep their ids; other labels follow in sorted order.
    """

    def __init__(self, config: BuildConfig, labels, run, known_labels: tuple[str, ...] = ()):
        super().__init__()
        self.config, self.labels, self.run, self.known_labels = config, labels, run, tuple(known_labels)

    def expand(self, media):
        return media | "Encode" >> beam.ParDo(
            _EncodeFn(self.config, self.known_labels), beam.pvalue.AsList(self.labels),
            beam.pvalue.AsSingleton(self.run)
        ).with_outputs("rejected", "prepared", main="fragments")


def _windowed(values: Iterable) -> Iterator:
    """Values emitted from finish_bundle need a window: the global one."""
    for value in values:
        if isinstance(value, beam.pvalue.TaggedOutput):
            yield beam.pvalue.TaggedOutput(value.tag, GlobalWindows.windowed_value(value.value))
        else:
            yield GlobalWindows.windowed_value(value)


def _count_encoded(outcome) -> None:
    count("images_passed_through" if outcome.passed_through else "images_reencoded")
    if outcome.trailer_bytes:  # bytes after the JPEG's end (motion photos, maker data): not image data
        count("jpeg_trailers_dropped")
        count("jpeg_trailer_bytes_dropped", outcome.trailer_bytes)


class _EncodeFn(beam.DoFn):
    def __init__(self, config: BuildConfig, known_labels: tuple[str, ...] = ()):
        self.config = config
        self.known_labels = known_labels
        self._settings: EncodeSettings | None = None
        self._pool: LocalPool | None = None

    def start_bundle(self):
        self._buffer = fragments.FragmentBuffer(self.config.fragment_bytes)
        self._run: RunInfo | None = None

    def process(self, chunk: list[MediaItem], labels: list[str], run: RunInfo):
        self._run = run
        publish.keep_lease(self.config, run)
        settings = self._settings_for(labels)
        if self.config.workers <= 1:
            yield from self._take(encode_batch(chunk, settings))
            return
        pool = LocalPool.shared(self.config.workers)
        self._pool = pool
        for start in range(0, len(chunk), TASK_ITEMS):
            items = chunk[start:start + TASK_ITEMS]
            if settings.frame_now:  # the workers write the fragments: records never come back here
                pool.submit("beam_jobs.encode_worker.encode_and_keep", items, settings, run.temp_dir,
                            self._worker_buffer, on_crash=_crash_reject, keeps=True)
            else:  # records wait for their embedding, in the graph
                pool.submit("shard_utils.encode.encode_batch", items, settings, on_crash=_crash_reject)
        yield from self._collect(pool)

    def _collect(self, pool: LocalPool) -> Iterator:
        """What the pool has finished, waiting for some while too much is queued (bounding what waits in memory)."""
        while pool.in_flight > 4 * self.config.workers:
            for outcomes in pool.results(block=True):
                yield from self._take(outcomes)
        for outcomes in pool.results():
            yield from self._take(outcomes)

    def finish_bundle(self):
        out: list = []
        if self._pool is not None and self._run is not None:
            for outcomes in self._pool.release_all("beam_jobs.encode_worker.flush_kept", self._run.temp_dir,
                                                   self._worker_buffer):
                out.extend(self._take(outcomes))
        if self._run is not None:
            out.extend(self._buffer.flush(self._run.temp_dir))
        yield from _windowed(out)


    @property
    def _worker_buffer(self) -> int:
        """Each worker's fragment buffer: together they hold what one encoder would (--fragment-mb)."""
        return max(1, self.config.fragment_bytes // self.config.workers)

    def _settings_for(self, labels: list[str]) -> EncodeSettings:
        if self._settings is None:
            cfg = self.config
            self._settings = EncodeSettings(
                image=cfg.image, seed=cfg.seed, splits=cfg.splits,
                label_ids={name: i for i, name in enumerate(label_order(labels, self.known_labels))},
                label_offset=cfg.label_offset,
                extras=cfg.listing.extras, video=cfg.video, frame_now=cfg.embed is None)
        return self._settings

    def _take(self, outcomes: Iterable) -> Iterator:
        for outcome in outcomes:
            if isinstance(outcome, (fragments.FragmentInfo, write_once.WrittenRun)):  # written by a worker
                yield outcome
                continue
            if isinstance(outcome, EncodeTally):
                _count_tally(outcome)
                continue
            progress.advance("encode")
            if isinstance(outcome, dict):
                yield _rejected(outcome)
                continue
            _count_encoded(outcome)
            crash_point("encode")
            if isinstance(outcome, Prepared):
                yield beam.pvalue.TaggedOutput("prepared", outcome)
            elif self._buffer.add(outcome):
                yield from self._buffer.flush(self._run.temp_dir)


def _count_tally(tally: EncodeTally) -> None:
    """The counters of records a worker encoded into its own fragments (as _count_encoded, per task)."""
    progress.advance("encode", tally.records)
    if tally.passed_through:
        count("images_passed_through", tally.passed_through)
    if tally.records > tally.passed_through:
        count("images_reencoded", tally.records - tally.passed_through)
    if tally.records:
        crash_point("encode")
    if tally.trailers:
        count("jpeg_trailers_dropped", tally.trailers)
        count("jpeg_trailer_bytes_dropped", tally.trailer_bytes)


def _crash_reject(item: MediaItem, why: str) -> dict:
    """The rejection of an item that crashed a worker process twice (a decoder bug on a hostile file)."""
    return reject(item, "corrupt", why)


class EmbedRecords(beam.PTransform):
    """Runs the embedding model on every prepared record's final image (each frame of a clip), adds the
    embedding to the record, frames it and writes fragments. Main output: FragmentInfo; tagged
    `rejected`: records whose embedding holds NaN or infinite values (`embedding_nan`)."""

    def __init__(self, config: BuildConfig, run):
        super().__init__()
        self.config, self.run = config, run

    def expand(self, prepared):
        from .embed import EmbedImages

        keyed = prepared | "BySource" >> beam.Map(lambda p: (p.meta.source_id, p))  # (source_id, Prepared)
        images = prepared | "Images" >> beam.FlatMap(embedding_inputs)  # (key, JPEG bytes)
        embedded = images | "Embed" >> EmbedImages(self.config.embed)
        vectors = embedded.embeddings | "VectorBySource" >> beam.Map(_by_source)  # (source_id, (frame, vector))
        bad = embedded.rejected | "BadBySource" >> beam.Map(lambda r: (_source_of(r[0]), r[2]))
        return (
            {"record": keyed, "vector": vectors, "bad": bad}
            | "Join" >> beam.CoGroupByKey()
            | "Attach" >> beam.FlatMap(attach_embedding, self.config.embed_key).with_outputs("rejected", main="records")
        )


def embedding_inputs(p: Prepared):
    """(key, JPEG) for the model: the record's image, or ((source_id, i), frame) for each frame of a clip."""
    if p.record.frames is None:
        yield p.meta.source_id, p.record.encoded
    else:
        for i, data in enumerate(p.record.frames):
            yield (p.meta.source_id, i), data


def _source_of(key) -> str:
    return key[0] if isinstance(key, tuple) else key


def _by_source(item):
    key, vector = item
    return _source_of(key), (key[1] if isinstance(key, tuple) else 0, vector)


def attach_embedding(joined, key: str):
    source_id, parts = joined
    prepared = list(parts["record"])
    if len(prepared) != 1:
        raise plan.InternalError(f"record {source_id!r} was prepared {len(prepared)} times")
    p = prepared[0]
    bad = sorted(parts["bad"])
    if bad:
        yield _rejected({"source": source_id, "reason": "embedding_nan", "message": bad[0]})
        return
    vectors = [v for _, v in sorted(parts["vector"], key=lambda fv: fv[0])]
    expected = 1 if p.record.frames is None else len(p.record.frames)
    if len(vectors) != expected:
        raise plan.InternalError(f"record {source_id!r}: {len(vectors)} embeddings for {expected} images")
    flat = tuple(float(x) for v in vectors for x in v.reshape(-1))
    yield framed(p, flat, key)


class WriteFragments(beam.PTransform):
    """Framed records (encode.Encoded) into sorted fragments; output: FragmentInfo."""

    def __init__(self, config: BuildConfig, run):
        super().__init__()
        self.config, self.run = config, run

    def expand(self, records):
        return records | "Buffer" >> beam.ParDo(_WriteFragmentsFn(self.config), beam.pvalue.AsSingleton(self.run))


class _WriteFragmentsFn(beam.DoFn):
    def __init__(self, config: BuildConfig):
        self.config = config

    def start_bundle(self):
        self._buffer = fragments.FragmentBuffer(self.config.fragment_bytes)
        self._run = None

    def process(self, record: Encoded, run: RunInfo):
        self._run = run
        if self._buffer.add(record):
            yield from self._buffer.flush(run.temp_dir)

    def finish_bundle(self):
        if self._run is not None:
            yield from _windowed(self._buffer.flush(self._run.temp_dir))


# ---------------------------------------------------------------------------------------------- dedup


class FindDuplicates(beam.PTransform):
    """--dedup: records with identical source bytes are kept once, deterministically (the smallest source id).

    Outputs: `dropped` (source ids of the others), tagged `rejected` (a `duplicate` dict naming the kept
    one) and `cross_split` ("splitA|splitB" for a duplicate kept in another split: leakage).
    """

    def expand(self, frags):
        return (
            frags
            | "Hashes" >> beam.FlatMap(lambda info: ((m.sha256, (m.source_id, s.split))
                                                    for s in info.sections for m in info.metas(s)))
            | "GroupSameBytes" >> beam.GroupByKey()  # (sha256, [(source_id, split)])
            | "Decide" >> beam.FlatMap(decide_duplicates).with_outputs("rejected", "cross_split", main="dropped")
        )


def decide_duplicates(grouped):
    _, entries = grouped
    entries = sorted(set(entries))
    if len(entries) < 2:
        return
    kept_id, kept_split = entries[0]
    for source_id, split in entries[1:]:
        yield source_id
        yield _rejected({"source": source_id, "reason": "duplicate",
                         "message": f"same bytes as {kept_id} (kept, in split {kept_split})"})
        if split != kept_split:
            yield beam.pvalue.TaggedOutput("cross_split", "|".join(sorted((split, kept_split))))


def without_dropped(info: fragments.FragmentInfo, dropped: list[str]) -> fragments.FragmentInfo:
    """The fragment with its duplicates marked dropped (they stay in its files, and count for nothing)."""
    if not dropped:
        return info
    gone = set(dropped)
    here = frozenset(m.source_id for s in info.sections for m in info.metas(s) if m.source_id in gone)
    return dataclasses.replace(info, dropped=here) if here else info


# ---------------------------------------------------------------------------------------------- plan


class PlanShards(beam.PTransform):
    """Counts records per split and hash bucket, plans each split's shards, and finds the exact key at
    which every shard starts. Outputs: `plans` ({split: SplitPlan}, once) or tagged `failure` (why not)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, frags):
        drafts = (
            frags
            | "Tally" >> beam.CombineGlobally(SplitTotalsFn(self.config.bucket_bits))  # {split: SplitTotals}
            | "Plan" >> beam.FlatMap(plan_or_failure, self.config).with_outputs("failure", main="drafts")
        )
        keys = (
            frags
            | "BoundaryKeys" >> beam.FlatMap(boundary_keys, beam.pvalue.AsList(drafts.drafts))  # ((split, b), key)
            | "GroupBucket" >> beam.GroupByKey()
            | "SortBucket" >> beam.MapTuple(lambda where, keys: (where, sorted(tuple(k) for k in keys)))
        )
        plans = drafts.drafts | "Boundaries" >> beam.Map(with_boundaries, beam.pvalue.AsDict(keys))
        return {"plans": plans, "failure": drafts.failure}


class SplitTotalsFn(beam.CombineFn):
    """{split: SplitTotals} over all fragments: records, bytes, and records per hash bucket."""

    def __init__(self, bits: int):
        self.bits = bits

    def create_accumulator(self):
        return {}

    def add_input(self, acc, info: fragments.FragmentInfo):
        for section in info.sections:
            totals = acc.setdefault(section.split, plan.SplitTotals())
            for meta in info.metas(section):
                totals.add(meta.sort_key, meta.length, self.bits)
        return acc

    def merge_accumulators(self, accs):
        out: dict[str, plan.SplitTotals] = {}
        for acc in accs:
            for split, totals in acc.items():
                out.setdefault(split, plan.SplitTotals()).merge(totals)
        return out

    def extract_output(self, acc):
        return acc


def plan_or_failure(totals: dict, config: BuildConfig):
    """The draft plans, or (tagged `failure`) the PlanError message that says why there are none."""
    progress.total("write", sum(t.num_records for t in totals.values()))
    try:
        yield plan.plan_splits(
            totals, expected_splits=[] if config.splits_from_data else [name for name, _ in config.splits],
            num_cores=config.num_cores, num_hosts=config.num_hosts,
            target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards,
            bucket_bits=config.bucket_bits)
    except plan.PlanError as exc:
        yield beam.pvalue.TaggedOutput("failure", str(exc))


def boundary_keys(info: fragments.FragmentInfo, drafts: list[dict]):
    """((split, bucket), key) for the records of this fragment in a bucket where some shard starts."""
    for plans in drafts:  # none when planning failed
        for section in info.sections:
            buckets = plans[section.split].boundary_buckets
            bits = plans[section.split].bucket_bits
            for meta in info.metas(section):
                b = plan.bucket_of(meta.sort_key, bits)
                if b in buckets:
                    yield (section.split, b), meta.order


def with_boundaries(drafts: dict, keys: dict) -> dict:
    per_split: dict[str, dict] = {}
    for (split, b), sorted_keys in keys.items():
        per_split.setdefault(split, {})[b] = sorted_keys
    return {split: p.with_boundaries(per_split.get(split, {})) for split, p in drafts.items()}


# ---------------------------------------------------------------------------------------------- write


class WriteShards(beam.PTransform):
    """Writes each shard under a temporary name from its slices of every fragment; output: ShardResult."""

    def __init__(self, config: BuildConfig, plans, run, dropped):
        super().__init__()
        self.config, self.plans, self.run, self.dropped = config, plans, run, dropped

    def expand(self, frags):
        dropped = beam.pvalue.AsList(self.dropped)
        return (
            frags
            | "Slice" >> beam.FlatMap(shard_slices, beam.pvalue.AsList(self.plans), dropped)  # ((split, i), Slice)
            | "GroupShard" >> beam.GroupByKey()  # ((split, shard), [Slice])
            | "Write" >> beam.ParDo(_WriteShardFn(self.config), beam.pvalue.AsList(self.plans),
                                    beam.pvalue.AsSingleton(self.run), dropped)
        )


class _WriteShardFn(beam.DoFn):
    """Writes shards, in the local worker processes when there are several (so shards are written in
    parallel), else here; output: ShardResult."""

    def __init__(self, config: BuildConfig):
        self.config = config

    def process(self, grouped, plans: list[dict], run: RunInfo, dropped: list[str]):
        (split, shard), pieces = grouped
        task = shard_writer.ShardTask(split, shard, tuple(pieces), plans[0][split])
        yield from self._write("write_shards", task, run, frozenset(dropped))

    def _write(self, fn: str, task, *args) -> Iterator[publish.ShardResult]:
        """shard_writer.<fn>([task], config, *args) here when there is one worker, else in the pool (what
        it has finished now; finish_bundle waits for the rest)."""
        if self.config.workers <= 1:
            yield from self._done(getattr(shard_writer, fn)([task], self.config, *args))
            return
        pool = LocalPool.shared(self.config.workers)
        pool.submit(f"beam_jobs.shard_writer.{fn}", [task], self.config, *args)
        for written in pool.results():
            yield from self._done(written)

    def finish_bundle(self):
        if self.config.workers > 1:
            pool = LocalPool.shared(self.config.workers)
            yield from _windowed(r for written in pool.drain() for r in self._done(written))

    READ_COUNTER = "fragment_bytes_read"

    def _done(self, written: list) -> Iterator[publish.ShardResult]:
        for w in written:
            count(self.READ_COUNTER, w.fragment_bytes_read)
            count("shards_written")
            count("bytes_written", w.result.num_bytes)
            count("images_written", w.result.num_records)
            progress.advance("write", w.result.num_records)
            yield w.result


def shard_slices(info: fragments.FragmentInfo, plans: list[dict], dropped: list[str]):
    gone = frozenset(dropped)
    for split_plans in plans:  # none when planning failed
        yield from fragments.slices(info, split_plans, gone)


class WriteShardsOnce(beam.PTransform):
    """A local build's encode, plan and write steps when the listing can be held: the listing is sorted and
    planned first, each planned shard's files are encoded in key order straight into one run, and the
    real plan (made as PlanShards makes it) takes each shard as the run it is, or copies it from runs
    (`shard_utils.write_once`). The shards' bytes are those of EncodeMedia + WriteShards; most are
    written once instead of twice.

    Input: chunks of MediaItems. Outputs: shards (ShardResult), plans ({split: SplitPlan}, once),
    failure (why no plan), rejected (dicts).
    """

    def __init__(self, config: BuildConfig, labels, run):
        super().__init__()
        self.config, self.labels, self.run = config, labels, run

    def expand(self, media):
        cfg, run = self.config, beam.pvalue.AsSingleton(self.run)
        encoded = (
            media
            | "GatherMedia" >> Gather()  # the whole listing (pickled chunks), once
            | "EncodeRuns" >> beam.ParDo(_EncodeRunFn(cfg), beam.pvalue.AsList(self.labels), run).with_outputs(
                "rejected", "prepared", main="runs")  # WrittenRun: the listing sorted, planned and encoded in runs
        )
        planned = (
            encoded.runs
            | "GatherRuns" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(plan_from_runs, cfg).with_outputs("failure", "plans", main="shards")
        )
        shards = planned.shards | "Write" >> beam.ParDo(_WriteRunShardFn(cfg), run)  # ShardResult
        return {"shards": shards, "plans": planned.plans, "failure": planned.failure, "rejected": encoded.rejected}


class Gather(beam.PTransform):
    """All elements as one list of their pickles (none when there are none): `unpacked` gives them back.

    Not combiners.ToList: it sends its list through a side input whose cache measures every object in
    it; and Beam's fallback coder pickles each object of a list on its own, and again whenever it
    samples an element's size (a fifth of a second per 4,000 listed files, while every worker waits).
    One bytes value per element is what Beam moves and measures cheaply."""

    def expand(self, pcoll):
        return (pcoll
                | "Pack" >> beam.Map(lambda x: (None, pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)))
                | "Group" >> beam.GroupByKey()
                | "Values" >> beam.MapTuple(lambda _, packed: list(packed)))


def unpacked(packed: Iterable[bytes]) -> Iterator:
    """The elements Gather packed, in its order."""
    return (pickle.loads(x) for x in packed)


def plan_runs(packed_chunks: list[bytes], config: BuildConfig) -> list[write_once.RunTask]:
    """The runs to encode, from the whole listing (write_once.run_tasks with the build's options)."""
    return write_once.run_tasks(
        (item for chunk in unpacked(packed_chunks) for item in chunk), splits=config.splits, seed=config.seed,
        num_cores=config.num_cores, num_hosts=config.num_hosts,
        target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards, workers=config.workers)


def plan_from_runs(runs: list[write_once.WrittenRun], config: BuildConfig):
    """The real plans (tagged `plans`, once) and every shard as pieces of the runs; or tagged `failure`."""
    for outcome in plan_or_failure(write_once.split_totals(runs), config):
        if isinstance(outcome, beam.pvalue.TaggedOutput):
            yield outcome
            return
        yield beam.pvalue.TaggedOutput("plans", outcome)
        yield from write_once.assign(runs, outcome)


class _EncodeRunFn(_EncodeFn):
    """Plans the runs from the whole listing (Gather's pickled chunks) and encodes each, in the local worker
    processes when there are several, else here; output: WrittenRun. One element, not one per run: Beam
    would pickle every run's items again to sample their size."""

    def process(self, packed_chunks: list[bytes], labels: list[str], run: RunInfo):
        self._run = run
        settings = self._settings_for(labels)
        args = (settings, run.temp_dir, self.config.bucket_bits)
        pool = LocalPool.shared(self.config.workers) if self.config.workers > 1 else None
        self._pool = pool
        for task in plan_runs(packed_chunks, self.config):
            publish.keep_lease(self.config, run)
            if pool is None:
                yield from self._take(encode_worker.encode_run(list(task.items), *args, task.shard))
                continue
            pool.submit("beam_jobs.encode_worker.encode_run", list(task.items), *args, task.shard,
                        on_crash=_crash_reject)
            yield from self._collect(pool)

    def finish_bundle(self):
        if self._pool is not None:
            yield from _windowed(r for outcomes in self._pool.drain() for r in self._take(outcomes))


class _WriteRunShardFn(_WriteShardFn):
    """Writes shards of runs (shard_writer.write_run_shard), in the local workers when there are several."""

    READ_COUNTER = "shard_bytes_copied"  # from runs, for shards that are not one whole run

    def process(self, task: write_once.ShardFromRuns, run: RunInfo):
        yield from self._write("write_run_shards", task, run)


# ---------------------------------------------------------------------------------------------- publish


class FinalizeDataset(beam.PTransform):
    """Checks the shards against the plans and the accounting, then publishes (manifest last), or fails
    with one line when planning failed or too many files were rejected.

    Input: a dict of PCollections: shards, plans, failure, rejected, skipped_files, tally, labels, run,
    cross_split, and any others a custom `finish` (default publish.finish) takes as lists, by name.
    """

    STANDARD = ("shards", "plans", "failure", "rejected", "skipped_files", "tally", "labels", "run", "cross_split")

    def __init__(self, config: BuildConfig, finish=None):
        super().__init__()
        self.config, self.finish = config, finish or publish.finish

    def expand(self, pcolls):
        side = beam.pvalue
        extra = {name: side.AsList(p) for name, p in pcolls.items() if name not in self.STANDARD}
        return (
            pcolls["shards"]
            | "AllShards" >> beam.combiners.ToList()
            | "Publish" >> beam.Map(
                publish_or_fail, self.config, self.finish, **extra,
                plans=side.AsList(pcolls["plans"]),
                failure=side.AsList(pcolls["failure"]),
                rejected=side.AsList(pcolls["rejected"]),
                skipped_files=side.AsList(pcolls["skipped_files"]),
                tally=side.AsSingleton(pcolls["tally"] | "SumTallies" >> beam.CombineGlobally(publish.sum_tallies)),
                labels=side.AsList(pcolls["labels"]),
                run=side.AsSingleton(pcolls["run"]),
                cross_split=side.AsList(pcolls["cross_split"]))
        )


def publish_or_fail(results: list, config: BuildConfig, finish=publish.finish, **side) -> str:
    """finish (publish.finish); a build that cannot publish fails the job with its one line (Dataflow,
    templates), or, locally, reports that line through a metric for the driver to raise (no worker traceback)."""
    try:
        return finish(results, config, **side)
    except (plan.PlanError, UsageError) as exc:
        if not config.local:
            raise
        Metrics.string_set(NAMESPACE, FAILURE_METRIC).add(f"{type(exc).__name__}: {exc}")
        return ""
