"""PlanShards: each split's exact shard sizes once its runs are encoded, and every shard as pieces of the runs.

One small element per run (its count and where its file lies) meets the others in one place; the plan is a
pure function of those counts (`shard_utils.sharding.shards`). Most shards are a prefix of one run, written
once; the rest are copied from the runs' tails. Nothing per record is gathered.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.common import MOVED, Joined, collected, summarized
from beam_jobs.run.config import BuildConfig
from shard_utils.errors import InternalError, PlanError
from shard_utils.sharding import plan
from shard_utils.sharding.carry import CarriedRun, LatestGeneration, carried_of, carried_splits
from shard_utils.sharding.naming import ShardNaming
from shard_utils.sharding.run_plan import SplitLayout
from shard_utils.sharding.runs import RunSummary, usable_counts
from shard_utils.sharding.shards import RunCount, plan_split_shards
from shard_utils.sharding.writer import ShardTask

__all__ = ["PlanShards", "plan_shards"]

class PlanShards(beam.PTransform):
    """Input: EncodedRun. Outputs: ShardTask (main), `plans` ({split: SplitShards}, once) and `failure` (why the
    encoded records cannot be sharded as asked). `dropped`: (split, run, position) of records left out.
    An append gives `latest` (each split's LatestGeneration) and `carried` (CarriedRun of the splits whose new
    records join their latest generation); a split with no usable new record then keeps its shards.
    `moved` (--near-dups group): RunFiles of records moved into their split from another, runs after its own."""

    def __init__(self, config: BuildConfig, layouts, naming: ShardNaming, dropped=None, carried=None, latest=None,
                 moved=None):
        super().__init__()
        self.config, self.layouts, self.naming, self.dropped = config, layouts, naming, dropped
        self.carried, self.latest, self.moved = carried, latest, moved

    def expand(self, runs):
        p = runs.pipeline
        dropped = self.dropped if self.dropped is not None else p | "NothingDropped" >> beam.Create([])
        carried = self.carried if self.carried is not None else p | "NothingCarried" >> beam.Create([])
        config, naming, latest = self.config, self.naming, self.latest
        summaries = summarized(runs, self.moved)
        planned = ({"summaries": summaries, "layouts": self.layouts, "dropped": dropped, "carried": carried}
                   | "RunsLayoutsDrops" >> Joined()
                   | "Plan" >> beam.FlatMap(lambda found: plan_shards(found["summaries"], found["layouts"],
                                                                     found["dropped"], config, naming,
                                                                     found["carried"], latest))
                   .with_outputs("plans", "failure", main="tasks"))
        return {"tasks": planned.tasks, "plans": collected(planned.plans, "Plans"), "failure": planned.failure}


def plan_shards(summaries: list[RunSummary], layouts: list[dict], dropped: list, config: BuildConfig,
                naming: ShardNaming, carried: Sequence[CarriedRun] = (),
                latest: Mapping[str, LatestGeneration] | None = None):
    """The shard tasks of every split, then (tagged `plans`) the plans; or (tagged `failure`) why not."""
    drops: dict[tuple[str, int], set[int]] = defaultdict(set)
    for split, run, position in dropped:
        drops[(split, run)].add(position)
    unit = config.num_cores * config.num_hosts
    joining = set(carried_splits(usable_counts(summaries, dropped), unit)) if latest is not None else set()
    for found in layouts:  # none when the layout could not be made
        tasks, plans = [], {}
        try:
            if not any(s.count for s in summaries):
                raise PlanError("no input file could be used (0 records)")
            for split, layout in sorted(with_moved_only(found, summaries, config).items()):
                files = {s.run: s.file for s in summaries if s.split == split and s.run != MOVED}
                split_drops = {run: frozenset(drops[(split, run)]) for run in range(layout.num_runs)
                               if drops.get((split, run))}
                counts = [RunCount(run, (file.count if (file := files.get(run)) else 0) - len(split_drops.get(run, ())),
                                   min(split_drops[run]) if run in split_drops else None)
                          for run in range(layout.num_runs)]
                layout, files, counts = with_moved(layout, files, counts, summaries)
                if not sum(c.records for c in counts):
                    if split_drops and latest is None:
                        raise PlanError(f"split {split!r}: every record in it is a duplicate of one kept in another "
                                        "split, or moved there with its near-duplicates (--dedup, --near-dups); "
                                        "remove the copies or build with --near-dups report")
                    if latest is not None:
                        continue  # an append: the split keeps its shards
                if latest is not None and split not in latest:
                    raise PlanError(f"split {split!r} is not in the dataset (it has {', '.join(sorted(latest))}); an "
                                    "append adds records to the dataset's splits")
                split_naming, carry = naming, None
                if latest is not None and split in joining and split in latest:
                    head = latest[split]
                    mine = sorted((c for c in carried if c.split == split), key=lambda c: c.position)
                    if len(mine) < len(head.shards):
                        return  # a shard could not be copied: CarryLatest says why, as the failure
                    layout, files, counts, split_drops, carry = with_carried(layout, head, mine, files, counts,
                                                                             split_drops, config)
                    split_naming = replace(naming, base={**naming.base, split: (head.first_place, head.host_offset)})
                planned = plan_split_shards(layout, counts, num_cores=config.num_cores, num_hosts=config.num_hosts,
                                            forced=config.num_shards)
                plans[split] = replace(planned, carried=carry)
                tasks += [shard_task(shard, files, split_drops, split_naming) for shard in planned.shards]
        except PlanError as exc:
            yield beam.pvalue.TaggedOutput("failure", str(exc))
            return
        progress.total("write", sum(p.num_records for p in plans.values()))
        yield beam.pvalue.TaggedOutput("plans", plans)
        yield from tasks


def with_moved_only(layouts: dict[str, SplitLayout], summaries: list[RunSummary], config: BuildConfig) -> dict:
    """The layouts, and one without runs of its own for each split that only records moved in from another have
    (an append: a near-duplicate of a record of a split no new file is listed in)."""
    out = dict(layouts)
    for s in summaries:
        if s.run == MOVED and s.file is not None and s.split not in out:
            moved = [m.file for m in summaries if m.run == MOVED and m.split == s.split and m.file is not None]
            records, size = sum(f.count for f in moved), sum(f.num_bytes for f in moved)
            unit = config.num_cores * config.num_hosts
            count = unit if records < unit else plan.num_shards(
                records, size, num_cores=config.num_cores, num_hosts=config.num_hosts,
                target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards, split=s.split)
            out[s.split] = SplitLayout(s.split, 0, size, count, 0, boundaries=())
    return out


def with_moved(layout: SplitLayout, files: dict, counts: list[RunCount], summaries: list[RunSummary]):
    """The split's runs with the runs of records moved into it after its own, in a fixed order."""
    moved = sorted((s.file for s in summaries if s.split == layout.split and s.run == MOVED and s.file is not None),
                   key=lambda f: f.meta_path)
    if not moved:
        return layout, files, counts
    first = layout.num_runs
    files = {**files, **{first + i: f for i, f in enumerate(moved)}}
    counts = counts + [RunCount(first + i, f.count) for i, f in enumerate(moved)]
    return replace(layout, num_runs=first + len(moved)), files, counts


def with_carried(layout: SplitLayout, head: LatestGeneration, runs: Sequence[CarriedRun], files: dict,
                 counts: list[RunCount], drops: dict, config: BuildConfig):
    """The split's runs with its latest generation's records first (one run per shard, in place order), then the
    new runs renumbered after them; the layout's shard count planned for all of their records."""
    if [r.position for r in runs] != list(range(len(head.shards))):
        raise InternalError(f"split {layout.split!r}: {len(runs)} of the {len(head.shards)} shards of its latest "
                            "generation were copied")
    first = len(runs)
    carry = carried_of(head, runs)
    new_bytes = sum(f.num_bytes for f in files.values() if f is not None)
    all_files = {r.position: r.file for r in runs} | {first + run: f for run, f in files.items()}
    all_counts = [RunCount(r.position, r.file.count) for r in runs] + [
        RunCount(first + c.run, c.records, c.first_dropped) for c in counts]
    all_drops = {first + run: gone for run, gone in drops.items()}
    records = sum(c.records for c in all_counts)
    count = plan.num_shards(records, carry.num_bytes + new_bytes, num_cores=config.num_cores,
                            num_hosts=config.num_hosts, target_shard_bytes=int(config.target_shard_mb * plan.MB),
                            forced=config.num_shards, split=layout.split)
    return (replace(layout, num_runs=len(all_counts), num_shards=count), all_files, all_counts, all_drops, carry)


def shard_task(shard, files: dict, drops: Mapping[int, frozenset[int]], naming: ShardNaming) -> ShardTask:
    runs = {p.run: files[p.run] for p in shard.pieces}
    dropped = {run: drops[run] for run in runs if drops.get(run)}
    return ShardTask(shard, naming.name(shard.split, shard.shard, shard.num_shards),
                     naming.place(shard.split, shard.shard, shard.num_shards), runs, dropped)
