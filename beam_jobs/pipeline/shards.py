"""PlanShards: each split's exact shard sizes once its runs are encoded, and every shard as pieces of the runs.

One small element per run (its count and where its file lies) meets the others in one place; the plan is a
pure function of those counts (`shard_utils.sharding.shards`). Most shards are a prefix of one run, written
once; the rest are copied from the runs' tails. Nothing per record is gathered.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import apache_beam as beam

from shard_utils.sharding.naming import ShardNaming
from shard_utils.sharding.runs import RunFile
from shard_utils.sharding.shards import RunCount, plan_split_shards
from shard_utils.sharding.writer import ShardTask

from beam_jobs import progress
from beam_jobs.jobs.config import BuildConfig
from beam_jobs.pipeline.common import Joined, collected
from shard_utils.errors import PlanError

__all__ = ["PlanShards", "RunSummary", "plan_shards"]


@dataclass(frozen=True)
class RunSummary:
    """What planning needs of an encoded run."""

    split: str
    run: int
    file: RunFile | None

    @property
    def count(self) -> int:
        return self.file.count if self.file is not None else 0


class PlanShards(beam.PTransform):
    """Input: EncodedRun. Outputs: ShardTask (main), `plans` ({split: SplitShards}, once) and `failure` (why the
    encoded records cannot be sharded as asked). `dropped`: (split, run, position) of records left out."""

    def __init__(self, config: BuildConfig, layouts, naming: ShardNaming, dropped=None):
        super().__init__()
        self.config, self.layouts, self.naming, self.dropped = config, layouts, naming, dropped

    def expand(self, runs):
        dropped = self.dropped if self.dropped is not None else runs.pipeline | "NothingDropped" >> beam.Create([])
        config, naming = self.config, self.naming
        summaries = runs | "Summarize" >> beam.Map(lambda r: RunSummary(r.split, r.run, r.file))
        planned = ({"summaries": summaries, "layouts": self.layouts, "dropped": dropped}
                   | "RunsLayoutsDrops" >> Joined()
                   | "Plan" >> beam.FlatMap(lambda found: plan_shards(found["summaries"], found["layouts"], found["dropped"],
                                                                     config, naming))
                   .with_outputs("plans", "failure", main="tasks"))
        return {"tasks": planned.tasks, "plans": collected(planned.plans, "Plans"), "failure": planned.failure}


def plan_shards(summaries: list[RunSummary], layouts: list[dict], dropped: list, config: BuildConfig,
                naming: ShardNaming):
    """The shard tasks of every split, then (tagged `plans`) the plans; or (tagged `failure`) why not."""
    drops: dict[tuple[str, int], set[int]] = defaultdict(set)
    for split, run, position in dropped:
        drops[(split, run)].add(position)
    for found in layouts:  # none when the layout could not be made
        tasks, plans = [], {}
        try:
            if not any(s.count for s in summaries):
                raise PlanError("no input file could be used (0 records)")
            for split, layout in sorted(found.items()):
                files = {s.run: s.file for s in summaries if s.split == split}
                counts = [RunCount(run, (files[run].count if files.get(run) else 0) - len(drops[(split, run)]),
                                   min(drops[(split, run)]) if drops[(split, run)] else None)
                          for run in range(layout.num_runs)]
                if not sum(c.records for c in counts) and any(drops[(split, r)] for r in range(layout.num_runs)):
                    raise PlanError(f"split {split!r}: every record in it is a duplicate of one kept in another "
                                         "split (--dedup); remove the copies or build without --dedup")
                planned = plan_split_shards(layout, counts, num_cores=config.num_cores, num_hosts=config.num_hosts,
                                            forced=config.num_shards)
                plans[split] = planned
                tasks += [shard_task(shard, files, drops, naming) for shard in planned.shards]
        except PlanError as exc:
            yield beam.pvalue.TaggedOutput("failure", str(exc))
            return
        progress.total("write", sum(p.num_records for p in plans.values()))
        yield beam.pvalue.TaggedOutput("plans", plans)
        yield from tasks


def shard_task(shard, files: dict, drops: dict, naming: ShardNaming) -> ShardTask:
    runs = {p.run: files[p.run] for p in shard.pieces}
    dropped = {run: frozenset(drops[(shard.split, run)]) for run in runs if drops.get((shard.split, run))}
    return ShardTask(shard, naming.name(shard.split, shard.shard, shard.num_shards),
                     naming.place(shard.split, shard.shard, shard.num_shards), runs, dropped)


