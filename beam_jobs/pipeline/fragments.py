"""PlanFragmentShards: a reshard's shards planned from its fragments, as ShardTasks for `WriteShards`.

A reshard reads each source shard once, and its records' new order scatters them over every new shard;
their bytes are known only as they are read. So the copying step writes them as sorted fragments
(`shard_utils.sharding.fragments`), and planning follows the build's (`PlanLayout`) with what the fragments
hold instead of a listing: every record counted per split and hash bucket, each split's layout made with one
run per shard (its records' bytes are known, none can be rejected), and the keys where shards start found
in the few buckets that hold them. Each shard is then its slices of every fragment, merged by the writer.
"""
from __future__ import annotations

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.common import WithSingleton, collected
from beam_jobs.pipeline.plan_runs import FindBoundaries, SplitTotalsFn
from beam_jobs.run.config import BuildConfig
from shard_utils.errors import InternalError, PlanError
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.sharding import fragments, plan
from shard_utils.sharding.fragments import FragmentInfo
from shard_utils.sharding.run_plan import BoundaryFinder, SplitLayout, plan_exact_layouts
from shard_utils.sharding.shards import ShardPlan
from shard_utils.sharding.writer import ShardTask

__all__ = ["PlanFragmentShards"]


class PlanFragmentShards(beam.PTransform):
    """Input: FragmentInfo. Outputs, as the build's PlanShards: `tasks` (ShardTask), `plans` ({split:
    SplitLayout}, once) and `failure` (why the records cannot be sharded as asked)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, frags):
        config = self.config
        planned = (frags
                   | "Count" >> beam.CombineGlobally(FragmentTotalsFn(config.bucket_bits))
                   | "Plan" >> beam.FlatMap(layouts_or_failure, config).with_outputs("failure", main="drafts"))
        layouts = collected(frags | "FindBoundaries" >> FindBoundaries(collected(planned.drafts, "Drafts"),
                                                                      boundary_keys), "Plans")
        tasks = (frags
                 | "WithPlans" >> WithSingleton(layouts)
                 | "Slice" >> beam.FlatMapTuple(lambda info, found: shard_slices(info, [found]))
                 | "GroupShard" >> beam.GroupByKey()
                 | "Tasks" >> beam.Map(shard_task, config.shard_extension))
        return {"tasks": tasks, "plans": layouts, "failure": planned.failure}


class FragmentTotalsFn(SplitTotalsFn):
    """{split: ListingTotals} over every fragment's records: their count, bytes (exact) and hash buckets."""

    def add_input(self, acc, info: FragmentInfo):
        for section in info.sections:
            metas = info.metas(section)
            self.add(acc, section.split, [m.sort_key for m in metas], [m.length for m in metas])
        return acc


def layouts_or_failure(totals: dict, config: BuildConfig):
    """The splits' layouts (one run per shard), or (tagged `failure`) the PlanError message saying why not."""
    progress.total("write", sum(t.count for t in totals.values()))
    try:
        yield plan_exact_layouts(totals, num_cores=config.num_cores, num_hosts=config.num_hosts,
                                 target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards)
    except PlanError as exc:
        yield beam.pvalue.TaggedOutput("failure", str(exc))


def boundary_keys(info: FragmentInfo, drafts: list[dict[str, SplitLayout]]):
    """((split, bucket), order key) of this fragment's records in a bucket where some shard starts."""
    for layouts in drafts:  # none when planning failed
        for section in info.sections:
            layout = layouts[section.split]
            for meta in info.metas(section):
                if BoundaryFinder.wanted(layout, meta.sort_key):
                    yield (section.split, plan.bucket_of(meta.sort_key, layout.bucket_bits)), meta.order


def shard_slices(info: FragmentInfo, found: list[dict[str, SplitLayout]]):
    """((split, shard, shard count, records planned), Slice) for every shard this fragment feeds."""
    for layouts in found:  # none when planning failed
        for (split, shard), piece in fragments.slices(info, layouts):
            layout = layouts[split]
            yield (split, shard, layout.num_shards, layout.run_size(shard)), piece


def shard_task(grouped, extension: str) -> ShardTask:
    """The shard's task, from ((split, shard, shard count, records planned), its slices of every fragment)."""
    (split, shard, num_shards, planned), pieces = grouped
    ordered = tuple(sorted(pieces, key=lambda s: (s.fragment, s.start)))
    if sum(p.count for p in ordered) != planned:
        raise InternalError(f"shard {shard} of split {split!r} got {sum(p.count for p in ordered)} records, "
                            f"planned {planned}")
    return ShardTask(ShardPlan(split, shard, num_shards, slices=ordered),
                     TFRECORD.shard_name(split, shard, num_shards, extension), shard)
