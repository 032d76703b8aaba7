"""EncodeRuns: every listed item read, checked, encoded and written into its run, in key order.

Items go to their run by key (the run boundaries PlanLayout found) and meet in a GroupByKey; each run is
then one unit of work: its items read (several at once from gs://), encoded and written into one run file
(`shard_utils.sharding.encode_run`). Locally the runs are encoded in the worker processes; when the runs are
fewer than the workers, each run is encoded in contiguous parts at once, then joined into the same file
(`shard_utils.sharding.run_parts`). A decoder that crashes its process on a hostile file costs only that
file: the run's (or part's) items are tried one by one, the ones that crash are rejected, and it is encoded
again without them.

Memory is not a property of a file: a worker the system killed (SIGKILL) or refused memory is tried again
with no other task in flight, and if that fails too the build stops naming the file, never rejecting it.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.chunks import Chained, KeyedItems
from beam_jobs.pipeline.common import Keyed, PooledDoFn, WithSingleton, count, rejected, windowed
from beam_jobs.pipeline.start import keep_lease
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import RunInfo
from shard_utils.errors import InternalError
from shard_utils.format.labels import label_order
from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import MediaItems
from shard_utils.media.budget import OutOfMemory
from shard_utils.media.encode import EncodeSettings, encode_item, killed_message, reject
from shard_utils.sharding.encode_run import EncodedRun, EncodeTally, RunTask, encode_run
from shard_utils.sharding.run_parts import join_parts, part_tasks, parts_per_run, remove_parts

if TYPE_CHECKING:
    from shard_utils.media.embed import EmbedRecords, EmbedSpec

__all__ = ["EncodeRuns"]

THROTTLED_SECONDS = "cumulativeThrottlingSeconds"  # the name every Beam IO gives its throttled time


class EncodeRuns(beam.PTransform):
    """Input: keyed chunks (PlanLayout's `keyed`). Main output: EncodedRun, one per run (its file is None when
    every item was rejected; its `quality` empty: the run's flags are the `quality` output, not carried through
    every later step); tagged `rejected`: dicts; tagged `quality`: the images' flags (a tuple of finding dicts a
    run, or a part of one).
    `known_labels` (an append: the dataset's labels) keep their ids; other labels follow in sorted order."""

    def __init__(self, config: BuildConfig, layouts, labels, run, known_labels: tuple[str, ...] = ()):
        super().__init__()
        self.config, self.layouts, self.labels, self.run = config, layouts, labels, run
        self.known_labels = tuple(known_labels)

    def expand(self, keyed):
        return (keyed
                | "WithLayouts" >> WithSingleton(self.layouts)
                | "Assign" >> beam.ParDo(_AssignRunsFn(part_workers(self.config)))
                | "GroupRuns" >> beam.GroupByKey()
                | "Encode" >> beam.ParDo(_EncodeRunFn(self.config, self.known_labels),
                                         beam.pvalue.AsList(self.labels),
                                         beam.pvalue.AsSingleton(self.run))
                .with_outputs("rejected", "quality", main="runs"))


def part_workers(config: BuildConfig) -> int:
    """The workers a run's parts are cut for (run_parts.parts_per_run; 1: every run encoded whole). A model's
    batches stay whole runs'; and a build that keeps its JPEGs as they are, checked by their markers alone, spends
    less on an image than joining parts costs (their bytes read, written and hashed again), so its runs stay whole."""
    if config.embed is not None:
        return 1
    if config.video is None and config.image.size is None and config.image.validate == "structure":
        return 1
    return config.workers


def assign_runs(chunk: list[Keyed], layouts: list[dict], workers: int = 1) \
        -> Iterable[tuple[tuple[str, int, int], MediaItems]]:
    """((split, run, parts it is encoded in), items) for the items of a chunk, grouped by run (cut from the
    chunk's columns: the items are not made here)."""
    keyed = KeyedItems.of(chunk)
    for found in layouts:  # none when planning failed
        by_run: dict[tuple[str, int], list[int]] = {}
        for split, of_split in by_split(keyed.splits).items():
            orders = keyed.orders
            for i, run in zip(of_split, found[split].runs_of(orders[i] for i in of_split), strict=True):
                by_run.setdefault((split, run), []).append(i)
        for (split, run), positions in by_run.items():
            yield (split, run, parts_per_run(found, workers, split, run)), keyed.items.select(positions)


class _AssignRunsFn(beam.DoFn):
    """(keyed chunk, layouts) pairs in, ((split, run, parts), items) out: `assign_runs` of each chunk, a run's
    items from a bundle's chunks joined into one element (up to HELD_ITEMS items held at once). A chunk's items
    spread over many runs (every run, with few of them), and each element costs Beam the same whatever its size."""

    HELD_ITEMS = 65536

    def __init__(self, workers: int):
        self.workers = workers

    def start_bundle(self):
        self._runs: dict[tuple[str, int, int], list[MediaItems]] = {}
        self._held = 0

    def process(self, pair):
        chunk, layouts = pair
        for key, items in assign_runs(chunk, [layouts], self.workers):
            self._runs.setdefault(key, []).append(items)
            self._held += len(items)
        if self._held >= self.HELD_ITEMS:
            yield from self._joined()

    def finish_bundle(self):
        yield from windowed(self._joined())

    def _joined(self) -> Iterable[tuple[tuple[str, int, int], MediaItems]]:
        runs, self._runs, self._held = self._runs, {}, 0
        for key, parts in runs.items():
            yield key, MediaItems.joined(parts)


def by_split(splits: Sequence[str]) -> dict[str, range | list[int]]:
    """{split: the positions of its items}, in order: a chunk's items are usually all of one split."""
    if len(set(splits)) == 1:
        return {splits[0]: range(len(splits))}
    out: dict[str, range | list[int]] = {}
    for i, split in enumerate(splits):
        out.setdefault(split, []).append(i)
    return out


def probe_item(item: MediaItem, settings: EncodeSettings) -> bool:
    """Encode one item and keep nothing: whether its decoder survives it (a pool task)."""
    encode_item(item, settings)
    return True


class _EncodeRunFn(PooledDoFn):
    def __init__(self, config: BuildConfig, known_labels: tuple[str, ...]):
        super().__init__(config.workers)
        self.config, self.known_labels = config, known_labels
        self._settings: EncodeSettings | None = None
        self._throttled_s = 0.0  # throttled time not yet counted (the counter takes whole seconds)

    def start_bundle(self):
        super().start_bundle()
        self._isolating: dict[tuple[str, int, int | None], dict] = {}
        self._joining: dict[tuple[str, int], list[EncodedRun | None]] = {}  # a run's parts encoded so far

    def process(self, grouped, labels: list[str], run: RunInfo):
        (split, index, parts), chunks = grouped
        self._run = keep_lease(run, self.config)
        if self._settings is None:
            ids = {name: i for i, name in enumerate(label_order(labels, self.known_labels))}
            self._settings = self.config.encode_settings(ids)
        task = RunTask(split, index, Chained(chunks))  # the items stay pickled until a worker reads them
        if parts == 1:
            yield from self._encode(task, ())
            return
        self._joining[(split, index)] = [None] * parts
        for part in part_tasks(task, parts, self.settings().seed):
            yield from self._encode(part, ())

    def _encode(self, task: RunTask, crashed: tuple[dict, ...], alone: bool = False):
        spec = self.config.embed
        kwargs = {"embed": _embedder(spec, self.config.embed_key), "embed_batch": spec.batch_size} \
            if spec is not None else {}
        kwargs["chunk_bytes"] = self.config.run_part_bytes
        yield from self.run(encode_run, (task, self.settings(), self._run.temp_dir), kwargs,
                            ("run", task, crashed, alone), alone=alone)

    def _join(self, parts: tuple[EncodedRun, ...], alone: bool = False):
        yield from self.run(join_parts, (parts, self._run.temp_dir), {"chunk_bytes": self.config.run_part_bytes},
                            ("join", parts, (), alone), alone=alone)

    def _probe(self, key, item: MediaItem, alone: bool):
        yield from self.run(probe_item, (item, self.settings()), {}, ("probe", key, item, alone), alone=alone)

    def call(self, element, *side):  # process() is overridden
        raise NotImplementedError

    def done(self, context, value) -> Iterable:
        kind, task, extra, _ = context
        if kind == "probe":
            yield from self._probed(task, extra, crashed=None)
            return
        if kind == "join":
            remove_parts(task)
            count("runs_encoded")
            yield value
            return
        encoded: EncodedRun = value
        yield from self._outputs(encoded, extra)
        encoded = replace(encoded, quality=()) if encoded.quality else encoded  # its flags went out above, once
        if task.part is None:
            count("runs_encoded")
            yield encoded
            return
        count("run_parts_encoded")
        yield from self._part_done(task.part, replace(encoded, rejected=(*extra, *encoded.rejected)))

    def _part_done(self, part: int, encoded: EncodedRun) -> Iterable:
        """Keep a part once encoded; once the run's last part is, join them into the run's file."""
        key = (encoded.split, encoded.run)
        parts = self._joining[key]
        parts[part] = encoded
        if all(p is not None for p in parts):
            del self._joining[key]
            yield from self._join(tuple(p for p in parts if p is not None))

    def _outputs(self, encoded: EncodedRun, extra: tuple[dict, ...]) -> Iterable:
        """The rejections and findings of an encoded run or part, and its counters."""
        for entry in (*extra, *encoded.rejected):
            progress.advance("encode")
            yield rejected(entry)
        if encoded.quality:  # one element a run, not one a finding: each element costs the driver ~40 us
            yield beam.pvalue.TaggedOutput("quality", encoded.quality)
        t = encoded.tally
        progress.advance("encode", t.records)
        count("images_passed_through", t.passed_through)
        count("images_reencoded", t.records - t.passed_through)
        if t.trailers:  # bytes after the JPEG's end (motion photos, maker data): not image data
            count("jpeg_trailers_dropped", t.trailers)
            count("jpeg_trailer_bytes_dropped", t.trailer_bytes)
        self._throttled(t)

    def _throttled(self, tally: EncodeTally) -> None:
        """Reads held back by throttling, as Beam's IOs report them: Dataflow's autoscaler reads a
        `cumulativeThrottlingSeconds` counter as time spent waiting on a service, and adds no workers for it."""
        if tally.read_retries:
            count("source_reads_retried", tally.read_retries)
        self._throttled_s += tally.throttled_s
        whole = int(self._throttled_s)
        if whole:
            count(THROTTLED_SECONDS, whole)
            self._throttled_s -= whole

    def failed(self, context, error: BaseException) -> Iterable:
        kind, task, extra, alone = context
        if not isinstance(error, OutOfMemory) or alone:
            raise error
        yield from self._again_alone(kind, task, extra)

    def _again_alone(self, kind: str, task, extra) -> Iterable:
        """The same work once more, with no other task in flight to share the memory."""
        if kind == "join":
            yield from self._join(task, alone=True)
        else:
            yield from self._encode(task, extra, alone=True) if kind == "run" else self._probe(task, extra, alone=True)

    def crashed(self, context, why: str, killed: bool) -> Iterable:
        kind, task, extra, alone = context
        if killed and not alone:
            yield from self._again_alone(kind, task, extra)
            return
        if kind == "join":
            raise RuntimeError(f"local pool: {why} while joining the parts of run {task[0].run} of split "
                               f"{task[0].split!r}")
        if kind == "probe":
            if killed:
                raise OutOfMemory(killed_message(extra, self.settings()))
            yield from self._probed(task, extra, crashed=why)
            return
        if len(task.items) == 0:
            raise RuntimeError(f"local pool: {why} while encoding run {task.run} of split {task.split!r}")
        key = (task.split, task.run, task.part)
        self._isolating[key] = {"task": task, "left": len(task.items), "culprits": [], "why": why,
                                "earlier": extra}
        for item in task.items:  # which item crashes it, keeping nothing: each alone, when the system killed it
            yield from self._probe(key, item, alone=killed)

    def _probed(self, key, item: MediaItem, crashed: str | None) -> Iterable:
        state = self._isolating[key]
        state["left"] -= 1
        if crashed is not None:
            state["culprits"].append(reject(item, "corrupt", crashed))
        if state["left"]:
            return
        del self._isolating[key]
        task, culprits = state["task"], state["culprits"]
        if not culprits:
            raise RuntimeError(f"local pool: {state['why']} while encoding run {task.run} of split {task.split!r}, "
                               "and no single file of it does")
        gone = {c["source"] for c in culprits}
        rest = replace(task, items=tuple(i for i in task.items if i.source_id not in gone))
        yield from self._encode(rest, (*state["earlier"], *culprits))

    def settings(self) -> EncodeSettings:
        """How items are encoded: made by the first process() of the DoFn, once the labels are known (a method,
        not a property: Beam reads a DoFn's attributes when it builds the graph)."""
        if self._settings is None:
            raise InternalError("an item is encoded before the labels are known")
        return self._settings


def _embedder(spec: EmbedSpec, key: str) -> EmbedRecords:
    from shard_utils.media.embed import EmbedRecords

    return EmbedRecords(spec, key)
