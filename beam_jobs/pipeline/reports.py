"""WriteReport: a per-file report (rejected or skipped files) written in sorted pieces, in parallel.

    entries ─┬─► Count (combined: bounded) ─► Bounds ─┐
             └────────────────────────────────────────┴─► Piece (range of each) ─► Group ─► Write (sorted)

Output: a dict with `counts` (one ReportCounts, without its sample) and `pieces` ((piece, path) of each piece
written). Publish joins only those under its one key and composes the pieces, in range order, into the report
(`beam_jobs.run.reports`).
"""
from __future__ import annotations

import apache_beam as beam

from beam_jobs.pipeline.common import WithSingleton
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.reports import PIECE_LINES, ReportCounts, piece_of, write_piece

__all__ = ["WriteReport"]


class _CountFn(beam.CombineFn):
    def create_accumulator(self) -> ReportCounts:
        return ReportCounts()

    def add_input(self, counts: ReportCounts, entry) -> ReportCounts:
        return counts.add(entry)

    def merge_accumulators(self, accumulators) -> ReportCounts:
        merged = ReportCounts()
        for counts in accumulators:
            merged.merge(counts)
        return merged

    def compact(self, counts: ReportCounts) -> ReportCounts:
        return counts.trimmed()

    def extract_output(self, counts: ReportCounts) -> ReportCounts:
        return counts.trimmed()


class WriteReport(beam.PTransform):
    """Report entries (dicts with `source` and `reason`) into pieces named `report` under the run's temporary
    folder (`run`: the RunInfo PCollection); about `piece_lines` lines a piece."""

    def __init__(self, report: str, run, piece_lines: int = PIECE_LINES):
        super().__init__()
        self.report, self.run, self.piece_lines = report, run, piece_lines

    def expand(self, entries):
        counted = entries | "Count" >> beam.CombineGlobally(_CountFn())
        bounds = counted | "Bounds" >> beam.Map(ReportCounts.bounds, self.piece_lines)
        pieces = (entries
                  | "WithBounds" >> WithSingleton(bounds)
                  | "Piece" >> beam.MapTuple(lambda entry, cut: (piece_of(entry, cut), entry))
                  | "Group" >> beam.GroupByKey()
                  | "Write" >> beam.Map(_written, self.report, beam.pvalue.AsSingleton(self.run)))
        return {"counts": counted | "Brief" >> beam.Map(ReportCounts.brief), "pieces": pieces}


def _written(group: tuple, report: str, run: RunInfo) -> tuple[int, str]:
    piece, entries = group
    return piece, write_piece(run.temp_dir, report, piece, entries)
