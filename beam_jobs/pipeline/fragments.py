"""The reshard's write path: records already encoded (copied from a dataset's shards) in sorted fragments.

A reshard reads each source shard once, and its records' new order scatters them over every new shard;
their bytes are known only as they are read. So the copying step writes them as sorted fragments, the
plan counts them per split and hash bucket, and each shard writer reads exactly its slice of every
fragment (`shard_utils.sharding.fragments`). A build, whose records' places are known from the listing before
anything is read, writes runs instead (`ShardMedia`).
"""
from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam

from beam_jobs import progress
from beam_jobs.pipeline.common import PooledDoFn, WithSingleton, collected, count
from beam_jobs.pipeline.start import keep_lease
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import RunInfo
from shard_utils.errors import PlanError
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.sharding import fragments, plan
from shard_utils.sharding.fragments import FragmentShardTask, write_fragment_shard
from shard_utils.sharding.writer import ShardResult

__all__ = ["PlanFragmentShards", "WriteFragmentShards"]


class PlanFragmentShards(beam.PTransform):
    """Counts records per split and hash bucket, plans each split's shards, and finds the exact key at which every
    shard starts. Outputs: `plans` ({split: SplitPlan}, once) or tagged `failure` (why not)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, frags):
        drafts = (frags
                  | "Tally" >> beam.CombineGlobally(SplitTotalsFn(self.config.bucket_bits))
                  | "Plan" >> beam.FlatMap(plan_or_failure, self.config).with_outputs("failure", main="drafts"))
        planned = collected(drafts.drafts, "Drafts")
        keys = (frags
                | "WithPlan" >> WithSingleton(planned)
                | "BoundaryKeys" >> beam.FlatMap(lambda pair: boundary_keys(pair[0], [pair[1]]))
                | "GroupBucket" >> beam.GroupByKey()
                | "SortBucket" >> beam.MapTuple(lambda where, keys: (where, sorted(tuple(k) for k in keys))))
        plans = ({"plan": planned | "KeyPlan" >> beam.Map(lambda p: (None, p)),
                  "keys": keys | "KeyKeys" >> beam.Map(lambda k: (None, k))}
                 | "PlanAndKeys" >> beam.CoGroupByKey()
                 | "Boundaries" >> beam.FlatMap(lambda kv: (with_boundaries(p, dict(kv[1]["keys"]))
                                                          for p in kv[1]["plan"])))
        return {"plans": plans, "failure": drafts.failure}


class SplitTotalsFn(beam.CombineFn):
    """{split: SplitTotals} over all fragments: records, bytes, and records per hash bucket."""

    def __init__(self, bits: int):
        self.bits = bits

    def create_accumulator(self):
        return {}

    def add_input(self, acc, info: fragments.FragmentInfo):
        for section in info.sections:
            totals = acc.setdefault(section.split, plan.SplitTotals())
            for meta in info.metas(section):
                totals.add(meta.sort_key, meta.length, self.bits)
        return acc

    def merge_accumulators(self, accs):
        out: dict[str, plan.SplitTotals] = {}
        for acc in accs:
            for split, totals in acc.items():
                out.setdefault(split, plan.SplitTotals()).merge(totals)
        return out

    def extract_output(self, acc):
        return acc


def plan_or_failure(totals: dict, config: BuildConfig):
    """The draft plans, or (tagged `failure`) the PlanError message that says why there are none."""
    progress.total("write", sum(t.num_records for t in totals.values()))
    try:
        yield plan.plan_splits(
            totals, expected_splits=[], num_cores=config.num_cores, num_hosts=config.num_hosts,
            target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards,
            bucket_bits=config.bucket_bits, remedy=plan.RESHARD_REMEDY)
    except PlanError as exc:
        yield beam.pvalue.TaggedOutput("failure", str(exc))


def boundary_keys(info: fragments.FragmentInfo, drafts: list[dict]):
    """((split, bucket), key) for the records of this fragment in a bucket where some shard starts."""
    for plans in drafts:  # none when planning failed
        for section in info.sections:
            buckets = plans[section.split].boundary_buckets
            bits = plans[section.split].bucket_bits
            for meta in info.metas(section):
                b = plan.bucket_of(meta.sort_key, bits)
                if b in buckets:
                    yield (section.split, b), meta.order


def with_boundaries(drafts: dict, keys: dict) -> dict:
    per_split: dict[str, dict] = {}
    for (split, b), sorted_keys in keys.items():
        per_split.setdefault(split, {})[b] = sorted_keys
    return {split: p.with_boundaries(per_split.get(split, {})) for split, p in drafts.items()}


class WriteFragmentShards(beam.PTransform):
    """Writes each shard under a temporary name from its slices of every fragment; output: ShardResult."""

    def __init__(self, config: BuildConfig, plans, run):
        super().__init__()
        self.config, self.plans, self.run = config, plans, run

    def expand(self, frags):
        return (frags
                | "WithPlans" >> WithSingleton(self.plans)
                | "Slice" >> beam.FlatMap(lambda pair: shard_slices(pair[0], [pair[1]]))  # ((split, i), Slice)
                | "GroupShard" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(_WriteFn(self.config), beam.pvalue.AsList(self.plans),
                                        beam.pvalue.AsSingleton(self.run)))


def shard_slices(info: fragments.FragmentInfo, plans: list[dict]):
    for split_plans in plans:  # none when planning failed
        yield from fragments.slices(info, split_plans)


class _WriteFn(PooledDoFn):
    def __init__(self, config: BuildConfig):
        super().__init__(config.workers)
        self.config = config

    def call(self, grouped, plans: list[dict], run: RunInfo):
        (split, shard), pieces = grouped
        split_plan = plans[0][split]
        name = TFRECORD.shard_name(split, shard, split_plan.num_shards, self.config.shard_extension)
        task = FragmentShardTask(split, shard, tuple(pieces), split_plan, name)
        return write_fragment_shard, (task, keep_lease(run, self.config).temp_dir, self.config.listing.extras), {
            "array_record_twin": self.config.array_record}, None

    def done(self, context, result: ShardResult) -> Iterable[ShardResult]:
        count("fragment_bytes_read", result.bytes_copied)
        count("shards_written")
        count("bytes_written", result.num_bytes)
        count("images_written", result.num_records)
        progress.advance("write", result.num_records)
        yield result
