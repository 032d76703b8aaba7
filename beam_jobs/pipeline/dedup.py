"""FindDuplicates (--dedup): records with identical source bytes are kept once, the smallest source id.

Each encoded run's record hashes (SHA-256 of the source file, from the run's metadata) meet in a
GroupByKey; the records that lose are dropped where they lie (their run keeps their bytes, the shard
plan skips them). An append also brings the dataset's own hashes: a new file whose bytes a record of the
dataset already has is dropped too.
"""
from __future__ import annotations

from typing import Iterable

import apache_beam as beam

from shard_utils.sharding.encode_run import EncodedRun

from beam_jobs.pipeline.common import rejected

__all__ = ["FindDuplicates", "run_hashes", "decide_duplicates"]


class FindDuplicates(beam.PTransform):
    """Input: EncodedRun. Outputs: `dropped` ((split, run, position) of every record dropped), tagged `rejected`
    (a `duplicate` dict naming the kept file) and `cross_split` ("splitA|splitB" for each duplicate whose kept
    twin is in another split). `existing`: (sha256, (source id, split)) of records already in the dataset."""

    def __init__(self, existing=None):
        super().__init__()
        self.existing = existing

    def expand(self, runs):
        hashes = runs | "Hashes" >> beam.FlatMap(run_hashes)
        if self.existing is not None:
            old = self.existing | "OldHashes" >> beam.MapTuple(lambda sha, where: (sha, (where[0], where[1], None)))
            hashes = (hashes, old) | "AllHashes" >> beam.Flatten()
        return (hashes
                | "GroupSameBytes" >> beam.GroupByKey()
                | "Decide" >> beam.FlatMap(decide_duplicates).with_outputs("rejected", "cross_split", main="dropped"))


def run_hashes(encoded: EncodedRun) -> Iterable[tuple[str, tuple]]:
    """(source sha256, (source id, split, (run, position))) of every record of a run."""
    if encoded.file is None:
        return
    for position, entry in enumerate(encoded.file.entries()):
        yield entry.meta.sha256, (entry.meta.source_id, encoded.split, (encoded.run, position))


def decide_duplicates(grouped) -> Iterable:
    """Of the records with one hash, the dataset's own (an append) or else the smallest source id is kept."""
    _, entries = grouped
    entries = sorted(set(entries), key=lambda e: (e[2] is not None, e[0]))  # the dataset's records first
    new = [e for e in entries if e[2] is not None]
    if not new or len(entries) < 2:
        return
    kept_id, kept_split, where = entries[0]
    how = "kept" if where is not None else "already in the dataset"
    for source_id, split, (run, position) in (new[1:] if where is not None else new):
        yield split, run, position
        yield rejected({"source": source_id, "reason": "duplicate",
                        "message": f"same bytes as {kept_id} ({how}, in split {kept_split})"})
        if split != kept_split:
            yield beam.pvalue.TaggedOutput("cross_split", "|".join(sorted((split, kept_split))))
