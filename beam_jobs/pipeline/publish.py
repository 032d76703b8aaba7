"""Publish: the dataset made visible, manifest last (`beam_jobs.publish` holds the steps, without Beam).

    Plan ─► Clear ─┬─► Move (per shard) ───────┬─► Commit
                   └─► MergeIndex (per split) ──┘

The rejected and skipped files and the quality findings are written first, in sorted pieces in parallel
(`WriteReports`); only their counts and the pieces' names join the rest under Plan's one key. Plan checks the shards and
the accounting and decides what to write; Clear makes room; shards move in and each split's index is written in
parallel; Commit composes the reports from their pieces and writes the manifest once every move and index is done. Every
step is safe to run twice, or twice at once. A build that cannot publish fails the job with one line (locally: a metric
the driver raises, so no worker traceback is printed).
"""
from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_jobs import publish
from beam_jobs.errors import UsageError
from beam_jobs.pipeline.common import Joined, PooledDoFn, count
from beam_jobs.pipeline.reports import WriteReports
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.failure import FAILURE_METRIC
from beam_jobs.run.reports import PIECE_LINES, Report
from beam_jobs.run.tally import NAMESPACE, sum_tallies
from shard_utils.errors import InternalError, PlanError

__all__ = ["Publish"]

REPORTS = ("rejected", "skipped_files", "quality")  # inputs written as reports, in pieces


class Publish(beam.PTransform):
    """Input: a dict of PCollections: shards (ShardResult), plans ({split: SplitShards}, once), failure, rejected,
    skipped_files, tally (Tally, summed here), labels, run (RunInfo), cross_split, quality (finding dicts, or tuples of
    them: flatten more findings into it), and any others `planner` takes as lists, by name. `planner` (default
    `publish.plan_publication`) decides the Publication; it gets the reports (rejected, skipped_files, quality) as
    `reports.Report`s. About `piece_lines` report lines per piece."""

    def __init__(self, config: BuildConfig, planner: Callable[..., publish.Publication | None] | None = None,
                 piece_lines: int = PIECE_LINES):
        super().__init__()
        self.config = config
        self.planner = planner or publish.plan_publication
        self.piece_lines = piece_lines

    def expand(self, pcolls):
        cfg = self.config
        run = beam.pvalue.AsSingleton(pcolls["run"])
        small = {name: pcoll for name, pcoll in pcolls.items() if name not in REPORTS}
        reports = {name: pcolls[name] for name in REPORTS if name in pcolls}
        if reports:
            written = reports | "Reports" >> WriteReports(pcolls["run"], self.piece_lines)
            small["report_counts"], small["report_pieces"] = written["counts"], written["pieces"]
        planned = (small
                   | "Everything" >> Joined()
                   | "Plan" >> beam.FlatMap(_or_fail(plan_step), cfg, self.planner)
                   | "Clear" >> beam.FlatMap(_or_fail(clear_step), cfg))
        moved = (planned
                 | "Moves" >> beam.FlatMap(lambda pub: pub.moves)
                 | "SpreadMoves" >> beam.Reshuffle()
                 | "Move" >> beam.ParDo(_MoveFn(cfg)))
        indexes = (planned
                   | "Indexes" >> beam.FlatMap(lambda pub: pub.indexes)
                   | "SpreadIndexes" >> beam.Reshuffle()
                   | "MergeIndex" >> beam.Map(publish.merge_index, cfg, run))
        return ({"pub": planned, "moved": moved, "indexes": indexes}
                | "Done" >> Joined()
                | "Commit" >> beam.FlatMap(commit_step, cfg))


def plan_step(found: dict, config: BuildConfig, planner):
    """The publication planned from every input (`found`: name -> list, as Publish's inputs dict names them; a
    report as its counts and pieces)."""
    found = dict(found)
    if "report_counts" in found:
        pieces = sorted(set(found.pop("report_pieces")))  # (report, piece, path), once: each report's in range order
        for name, counts in found.pop("report_counts")[0].items():
            found[name] = Report(counts, tuple(path for report, _, path in pieces if report == name))
    side = {name: values for name, values in found.items() if name not in ("shards", "run", "tally", "plans")}
    pub = planner(found["shards"], config, run=found["run"][0], tally=sum_tallies(found["tally"]),
                  plans=found["plans"], **side)
    if pub is not None:  # None: nothing to publish (an append that found nothing new)
        yield pub


def clear_step(pub: publish.Publication, config: BuildConfig):
    publish.clear_output(pub, config)
    yield pub


class _MoveFn(PooledDoFn):
    """Moves shards into the output (locally in the build's worker processes, so several at once)."""

    def __init__(self, config: BuildConfig):
        super().__init__(config.workers)
        self.config = config

    def call(self, move: publish.Move):
        return publish.move_shard, (move, self.config), {}, None

    def done(self, context, name: str):
        count("shards_published")
        yield name


def commit_step(found: dict, config: BuildConfig):
    for pub in found["pub"]:  # none when the publication could not be planned
        moved, indexes = found["moved"], found["indexes"]
        if sorted(moved) != sorted(m.name for m in pub.moves):
            raise InternalError(f"{len(moved)} of {len(pub.moves)} shards were moved into the output")
        yield publish.commit(pub, config, dict(indexes))


def _or_fail(step: Callable) -> Callable:
    """The step; a build that cannot publish fails the job with its one line (Dataflow, templates), or, locally,
    reports that line through a metric for the driver to raise, and the step gives nothing."""
    def guarded(element, config: BuildConfig, *args, **kwargs):
        try:
            yield from step(element, config, *args, **kwargs)
        except (PlanError, UsageError) as exc:
            if not config.local:
                raise
            Metrics.string_set(NAMESPACE, FAILURE_METRIC).add(f"{type(exc).__name__}: {exc}")

    guarded.__name__ = step.__name__
    return guarded
