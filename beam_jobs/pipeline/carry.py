"""CarryLatest: for an append, the latest generation of each split whose new records are too few for shards of
their own, copied shard by shard into runs (records checked, never decoded) that the planner puts first.

    encoded runs ─► usable records per split ─► CarryTask per shard of those splits' latest generation
                                                 ─► CarriedRun (one run per shard, in parallel)

See `shard_utils.sharding.carry`. Nothing is read when every split got enough new records (or none).
"""
from __future__ import annotations

import apache_beam as beam

from beam_jobs.pipeline.common import Joined, count, summarized
from beam_jobs.run.config import BuildConfig
from shard_utils import storage
from shard_utils.format.index import IndexFormatError
from shard_utils.format.manifest import Manifest
from shard_utils.sharding.carry import LatestGeneration, carried_splits, carry_shard, carry_tasks
from shard_utils.sharding.copy_records import DamagedShard
from shard_utils.sharding.runs import usable_counts

__all__ = ["CarryLatest"]


def _damaged(exc: BaseException) -> str:
    return f"cannot append to a damaged dataset: {storage.problem(exc)} (tpu-shards verify --deep lists every problem)"


class CarryLatest(beam.PTransform):
    """Input: EncodedRun. Outputs: `runs` (CarriedRun) and `failure` (a line naming a damaged shard or index).
    `dropped`: (split, run, position) of new records left out as duplicates or moved; `moved` (--near-dups
    group): RunFiles of records moved into their split, which count there as the planner counts them."""

    def __init__(self, config: BuildConfig, old: Manifest, latest: dict[str, LatestGeneration], run, dropped,
                 moved=None):
        super().__init__()
        self.config, self.old, self.latest, self.run, self.dropped = config, old, latest, run, dropped
        self.moved = moved

    def expand(self, runs):
        old, latest, unit = self.old, self.latest, self.config.num_cores * self.config.num_hosts
        summaries = summarized(runs, self.moved)
        tasks = ({"summaries": summaries, "dropped": self.dropped}
                 | "RunsAndDrops" >> Joined()
                 | "Tasks" >> beam.FlatMap(tasks_for, old, latest, unit).with_outputs("failure", main="tasks"))
        carried = (tasks.tasks
                   | "Spread" >> beam.Reshuffle()
                   | "Copy" >> beam.ParDo(_CarryFn(self.config), beam.pvalue.AsSingleton(self.run))
                   .with_outputs("failure", main="runs"))
        return {"runs": carried.runs,
                "failure": (tasks.failure, carried.failure) | "CarryFailures" >> beam.Flatten()}


def tasks_for(found: dict, old: Manifest, latest: dict[str, LatestGeneration], unit: int):
    """A CarryTask per shard of the latest generation of every split that needs it; tagged `failure`: why not."""
    usable = usable_counts(found["summaries"], found["dropped"])
    for split in carried_splits(usable, unit):
        if split not in latest:
            continue  # not a split of the dataset: the planner says so
        if old.split(split).index is None:
            yield beam.pvalue.TaggedOutput("failure", (
                f"split {split!r}: {usable[split]} new records are too few for a generation of their own ({unit} "
                f"shards), and the latest generation of a dataset without TFRecord shards cannot be written again "
                f"with them; append at least {unit} new files to that split, or build the dataset with --format both"))
            continue
        try:
            yield from carry_tasks(old, latest[split])
        except (IndexFormatError, DamagedShard, storage.StorageError) as exc:
            yield beam.pvalue.TaggedOutput("failure", _damaged(exc))


class _CarryFn(beam.DoFn):
    def __init__(self, config: BuildConfig):
        self.config = config

    def process(self, task, run):
        try:
            yield carry_shard(task, run.temp_dir, seed=self.config.seed, label_offset=self.config.label_offset,
                              extras=self.config.listing.extras)
        except (DamagedShard, storage.StorageError) as exc:
            yield beam.pvalue.TaggedOutput("failure", _damaged(exc))
            return
        count("shards_carried")
