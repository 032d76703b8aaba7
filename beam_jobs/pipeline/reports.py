"""WriteReports: the per-file reports (rejected and skipped files, quality findings) written in sorted pieces,
in parallel, all of them by the same few steps.

    entries ─┬─► Count (combined: bounded, per report) ─► Bounds ─┐
             └────────────────────────────────────────────────────┴─► Piece (report, range) ─► Group ─► Write

Output: a dict with `counts` (one {report: ReportCounts}, without their samples) and `pieces` ((report, piece,
path) of each piece written). Publish joins only those under its one key and composes each report's pieces,
in range order, into the report (`beam_jobs.run.reports`). One count, join and grouping serve every
report: each report of its own would add their stages to every build.
"""
from __future__ import annotations

import itertools

import apache_beam as beam

from beam_jobs.pipeline.common import WithSingleton
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.reports import PIECE_LINES, ReportCounts, batch_of, piece_of, write_piece

__all__ = ["WriteReports"]


class _CountFn(beam.CombineFn):
    """{report: (ReportCounts without their sample, where its pieces start)} of (report, entries) pairs; every
    report named, so an empty one is counted too. The sample stays in the accumulators: the output is read as a
    side input, which Beam weighs object by object (a sample of thousands of keys cost ~30 us per line)."""

    def __init__(self, reports: tuple[str, ...], piece_lines: int):
        self.reports, self.piece_lines = reports, piece_lines

    def create_accumulator(self) -> dict[str, ReportCounts]:
        return {name: ReportCounts() for name in self.reports}

    def add_input(self, counts: dict[str, ReportCounts], named) -> dict[str, ReportCounts]:
        name, batch = named
        one = counts[name]
        for entry in batch:
            one = one.add(entry)
        counts[name] = one
        return counts

    def merge_accumulators(self, accumulators) -> dict[str, ReportCounts]:
        merged = self.create_accumulator()
        for counts in accumulators:
            for name, one in counts.items():
                merged[name].merge(one)
        return merged

    def compact(self, counts: dict[str, ReportCounts]) -> dict[str, ReportCounts]:
        return {name: one.trimmed() for name, one in counts.items()}

    def extract_output(self, counts: dict[str, ReportCounts]) -> dict[str, tuple[ReportCounts, tuple]]:
        return {name: (one.brief(), one.bounds(self.piece_lines)) for name, one in self.compact(counts).items()}


class WriteReports(beam.PTransform):
    """Report entries (a dict: report name -> PCollection of dicts with `source` and `reason`, or quality
    findings; an element may also be a tuple of them, a run's flags: one element, not one each) into pieces named
    for their report under the run's temporary folder (`run`: the RunInfo PCollection); about `piece_lines` lines
    a piece."""

    def __init__(self, run, piece_lines: int = PIECE_LINES):
        super().__init__()
        self.run, self.piece_lines = run, piece_lines

    def expand(self, reports: dict):
        piece_lines = self.piece_lines
        entries = ([pcoll | f"Name{name.title().replace('_', '')}" >> beam.Map(lambda one, n=name: (n, batch_of(one)))
                    for name, pcoll in reports.items()]
                   | "AllEntries" >> beam.Flatten())
        counted = entries | "Count" >> beam.CombineGlobally(_CountFn(tuple(reports), piece_lines))
        bounds = counted | "Bounds" >> beam.Map(lambda counts: {name: cuts for name, (_, cuts) in counts.items()})
        pieces = (entries
                  | "WithBounds" >> WithSingleton(bounds)
                  | "Piece" >> beam.FlatMapTuple(_by_piece)
                  | "Group" >> beam.GroupByKey()
                  | "Write" >> beam.Map(_written, beam.pvalue.AsSingleton(self.run)))
        brief = counted | "Brief" >> beam.Map(lambda counts: {name: one for name, (one, _) in counts.items()})
        return {"counts": brief, "pieces": pieces}


def _by_piece(named: tuple, cuts: dict) -> list[tuple[tuple[str, int], tuple]]:
    """((report, piece), entries) for a batch of a report's entries, split by the piece each goes in."""
    name, batch = named
    bounds = cuts[name]
    if not bounds:
        return [((name, 0), batch)]
    by_piece: dict[int, list] = {}
    for entry in batch:
        by_piece.setdefault(piece_of(entry, bounds), []).append(entry)
    return [((name, piece), tuple(entries)) for piece, entries in by_piece.items()]


def _written(group: tuple, run: RunInfo) -> tuple[str, int, str]:
    (report, piece), batches = group
    return report, piece, write_piece(run.temp_dir, report, piece, itertools.chain.from_iterable(batches))
