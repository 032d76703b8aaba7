"""WriteShards: every planned shard written under the run's temporary folder, with its index part.

A shard that is a prefix of a run is that run's first bytes: moved and cut locally (the tail past the cut
saved beside it first), composed from the run's parts by Cloud Storage on gs://; any other shard is copied
from byte ranges of the runs, read in large blocks (`shard_utils.sharding.writer`). The copies are written
first, from the runs' files; a copy run again after a prefix was taken (the step retried or run twice at
once) reads the saved tail. A reshard's shards are all copies: each merges its slices of every fragment
(`PlanFragmentShards`). Shards are spread over the workers; locally they are written in the job's worker
processes. With --format array_record or both, each shard's ArrayRecord
twin is written from the finished shard by the same call (`writer.write_twin`).
"""
from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.common import PooledDoFn, WithSingleton, count
from beam_jobs.pipeline.start import keep_lease
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import RunInfo
from shard_utils.sharding.writer import ShardResult, ShardTask, write_shard

__all__ = ["WriteShards"]


class WriteShards(beam.PTransform):
    """Input: ShardTask. Output: ShardResult (the shard under its temporary name). `merged`: every task is a
    reshard's, slices of fragments merged, none a prefix, and they come spread over keys by a grouping: each is
    written as it comes."""

    def __init__(self, config: BuildConfig, run, *, merged: bool = False):
        super().__init__()
        self.config, self.run, self.merged = config, run, merged

    def expand(self, tasks):
        run = beam.pvalue.AsSingleton(self.run)
        if self.merged:
            return tasks | "Merge" >> beam.ParDo(_WriteShardFn(self.config), run)
        copies = (tasks
                  | "Copied" >> beam.Filter(lambda task: not task.plan.prefix)
                  | "SpreadCopies" >> beam.Reshuffle()
                  | "Copy" >> beam.ParDo(_WriteShardFn(self.config), run))
        copied = copies | "CopiesDone" >> beam.combiners.Count.Globally()
        prefixes = (tasks
                    | "Prefixes" >> beam.Filter(lambda task: task.plan.prefix)
                    | "AfterCopies" >> WithSingleton(copied)
                    | "Unpair" >> beam.MapTuple(lambda task, _: task)
                    | "SpreadPrefixes" >> beam.Reshuffle()
                    | "Take" >> beam.ParDo(_WriteShardFn(self.config), run))
        return (copies, prefixes) | "AllShards" >> beam.Flatten()


class _WriteShardFn(PooledDoFn):
    def __init__(self, config: BuildConfig):
        super().__init__(config.workers)
        self.config = config

    def call(self, task: ShardTask, run: RunInfo):
        return write_shard, (task, keep_lease(run, self.config).temp_dir, self.config.listing.extras), {
            "array_record_twin": self.config.array_record}, None

    def done(self, context, result: ShardResult) -> Iterable[ShardResult]:
        count("shards_written")
        count("bytes_written", result.num_bytes)
        if result.array_record is not None:
            count("array_record_bytes_written", result.array_record.num_bytes)
        count("images_written", result.num_records)
        count("shard_bytes_copied", result.bytes_copied)
        progress.advance("write", result.num_records)
        yield result
