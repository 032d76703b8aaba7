"""PlanLayout: each split's shard count and runs, decided from the listing before anything is encoded.

Every listed item gets its split and its place in the split's order (a seeded hash of its source id). The
items are counted per split (with a histogram of their keys), a small sample of them (the first in key
order) is encoded to learn what records their files become, and each split's shard count and runs follow
(`shard_utils.sharding.run_plan`). Only the keys of the few hash buckets where a run starts are grouped and
sorted, to find the exact key where each run starts.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import apache_beam as beam

from beam_jobs.local.pool import Done, LocalPool, Raised
from beam_jobs.pipeline.chunks import KeyedItems
from beam_jobs.pipeline.common import Joined, Keyed, WithSingleton, collected, count
from beam_jobs.run.config import BuildConfig
from shard_utils.errors import PlanError
from shard_utils.format.order import choose_split, sort_keys
from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import MediaItems
from shard_utils.media.encode import EncodeSettings
from shard_utils.sharding import plan, run_plan
from shard_utils.sharding.encode_run import weigh_sample
from shard_utils.sharding.run_plan import BoundaryFinder, ListingTotals, SizeSample, SplitLayout

__all__ = ["FindBoundaries", "ListingTotalsFn", "PlanLayout", "SplitTotalsFn", "key_chunk"]

SAMPLE_SIZE = 32  # items encoded to estimate the records' bytes



class PlanLayout(beam.PTransform):
    """Input: chunks of MediaItems. Outputs: `keyed` (the chunks as KeyedItems: (split, order key, item) each),
    `layouts` ({split: SplitLayout} with run boundaries, once; nothing when planning failed) and `failure`
    (why no layout could be made)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, media):
        cfg = self.config
        keyed = media | "Key" >> beam.Map(key_chunk, cfg.splits, cfg.seed)
        planned = (keyed  # counted and sampled in one pass: (totals, sample items)
                   | "CountAndSample" >> beam.CombineGlobally(beam.combiners.SingleInputTupleCombineFn(
                       ListingTotalsFn(cfg.bucket_bits), SmallestFn(SAMPLE_SIZE)))
                   | "Plan" >> beam.FlatMapTuple(lambda totals, first: layouts_or_failure(
                       totals, sample_sizes(first, cfg), cfg)).with_outputs("failure", main="drafts"))
        layouts = keyed | "FindBoundaries" >> FindBoundaries(collected(planned.drafts, "Drafts"), boundary_keys)
        return {"keyed": keyed, "layouts": layouts, "failure": planned.failure}


class FindBoundaries(beam.PTransform):
    """The draft layouts ({split: SplitLayout}, once) with their run boundaries, found from the input's keys:
    `keys_of(element, [drafts])` gives ((split, bucket), order key) of its keys in a bucket where a run starts;
    only those buckets' keys are grouped and sorted. The build's input is keyed listing chunks, a reshard's its
    fragments."""

    def __init__(self, drafts, keys_of: Callable[[Any, list], Iterable]):
        super().__init__()
        self.drafts, self.keys_of = drafts, keys_of

    def expand(self, pcoll):
        drafts, keys_of = self.drafts, self.keys_of
        picks = (pcoll
                 | "WithDrafts" >> WithSingleton(drafts)
                 | "BoundaryKeys" >> beam.FlatMapTuple(lambda element, draft: keys_of(element, [draft]))
                 | "GroupBucket" >> beam.GroupByKey()
                 | "Pick" >> beam.FlatMap(pick_boundaries, beam.pvalue.AsList(drafts)))
        return ({"drafts": drafts, "picks": picks}
                | "DraftsAndPicks" >> Joined()
                | "Boundaries" >> beam.FlatMap(lambda found: (with_boundaries(d, found["picks"])
                                                              for d in found["drafts"])))


def key_chunk(chunk: Sequence[MediaItem], splits, seed: int) -> KeyedItems:
    """Each item with its split and its place in the split's order (`item_order`): (split, order key, item),
    read from the chunk's columns (its items are not made)."""
    fractions = list(splits)
    items = MediaItems.of(chunk)
    ids = items.source_ids
    if len(fractions) == 1:  # every item without a split of its own goes to the one split
        split_of = [own or fractions[0][0] for own in items.splits]
    else:
        split_of = [own or choose_split(fractions, seed, i) for own, i in zip(items.splits, ids, strict=True)]
    return KeyedItems(split_of, list(zip(sort_keys(seed, ids), ids, strict=True)), items)


class SplitTotalsFn(beam.CombineFn):
    """{split: ListingTotals}: what a subclass's `add_input` adds (`add`), merged split by split."""

    def __init__(self, bits: int):
        self.bits = bits

    def create_accumulator(self):
        return {}

    def add(self, acc: dict, split: str, sort_keys: list[int], sizes: list[int]) -> None:
        acc.setdefault(split, ListingTotals(keys=run_plan.BucketCounts(self.bits))).add(sort_keys, sizes)

    def merge_accumulators(self, accs):
        by_split: dict[str, list[ListingTotals]] = {}
        for acc in accs:
            for split, totals in acc.items():
                by_split.setdefault(split, []).append(totals)
        out: dict[str, ListingTotals] = {}
        for split, many in by_split.items():  # each split's histograms added in one pass
            out[split] = ListingTotals(keys=run_plan.BucketCounts(self.bits))
            out[split].merge_all(many)
        return out

    def extract_output(self, acc):
        return acc


class ListingTotalsFn(SplitTotalsFn):
    """{split: ListingTotals} of every keyed item."""

    def add_input(self, acc, chunk: list[Keyed]):
        keyed = KeyedItems.of(chunk)
        names = set(keyed.splits)
        if len(names) == 1:  # the usual chunk: all of one split
            self.add(acc, names.pop(), [key for key, _ in keyed.orders], keyed.items.sizes)
            return acc
        by_split: dict[str, tuple[list, list]] = {}
        for split, (key, _), size in zip(keyed.splits, keyed.orders, keyed.items.sizes, strict=True):
            keys, sizes = by_split.setdefault(split, ([], []))
            keys.append(key)
            sizes.append(size)
        for split, (keys, sizes) in by_split.items():
            self.add(acc, split, keys, sizes)
        return acc


class SmallestFn(beam.CombineFn):
    """The n items first in key order, over every split: a sample of the listing that depends on nothing but
    the listing and the seed."""

    def __init__(self, n: int):
        self.n = n

    def create_accumulator(self):
        return []

    def add_input(self, acc, chunk: list[Keyed]):
        keyed = KeyedItems.of(chunk)
        orders, items = keyed.orders, keyed.items  # only the items that may be among the n first are made
        candidates = range(len(orders)) if len(acc) < self.n else [
            i for i, order in enumerate(orders) if order < acc[-1][0]]  # acc is sorted: nsmallest's list
        first = heapq.nsmallest(self.n, candidates, key=orders.__getitem__)
        return heapq.nsmallest(self.n, acc + [(orders[i], items[i]) for i in first], key=lambda p: p[0])

    def merge_accumulators(self, accs):
        return heapq.nsmallest(self.n, [p for acc in accs for p in acc], key=lambda p: p[0])

    def extract_output(self, acc):
        return [item for _, item in acc]


def _embedding_bytes(config: BuildConfig) -> int:
    """What an embedding adds to a record: 4 bytes a value, a vector per frame, 24 of framing (0 without one)."""
    if not config.embed:
        return 0
    frames = config.video.frames if config.video else 1
    assert frames is not None  # VideoOptions refuses a clip option without frames
    return 4 * int(dict(config.embed_info).get("embedding_dim", 0)) * frames + 24


def sample_sizes(items: list[MediaItem], config: BuildConfig) -> SizeSample:
    """What the sample's files and records weigh (rejected files are left out). Label ids do not change a
    record's size enough to matter, so the sample does not wait for the label set; the quality checks do not
    change it at all (a record holds none of what they find), so the sample is encoded without them. With a local
    pool the sample is cut into one contiguous part per worker, encoded at once: the workers wait for the plan."""
    if not items:
        return SizeSample()
    settings = config.encode_settings({name: 0 for item in items for name in item.labels})
    settings = replace(settings, image=replace(settings.image, inspect=False), frame_now=True)
    workers = min(len(items), config.workers if config.embed is None else 1)  # the pool EncodeRuns uses, if any
    parts = [items[len(items) * i // workers:len(items) * (i + 1) // workers] for i in range(workers)]
    weighed = _pooled(parts, settings, workers) if workers > 1 else [weigh_sample(items, settings)]
    source, record, records = (sum(column) for column in zip(*weighed, strict=True))
    count("sample_encoded", records)
    return SizeSample(source, record + records * _embedding_bytes(config), records)


def _pooled(parts: list[list[MediaItem]], settings: EncodeSettings, workers: int,
            weigh: Callable[[list[MediaItem], EncodeSettings], tuple[int, int, int]] = weigh_sample
            ) -> list[tuple[int, int, int]]:
    """`weigh` (weigh_sample) of each part in the local pool; a part whose worker crashed (a hostile file) is
    weighed here, as every part was before the pool did it. The pool holds nothing else at this point of the graph
    (if it did, the parts are weighed here, leaving other steps' outcomes alone)."""
    pool = LocalPool.shared(workers)
    if pool.in_flight:
        return [weigh(part, settings) for part in parts]
    tickets = {pool.submit(weigh, part, settings): i for i, part in enumerate(parts)}
    weighed: list = [None] * len(parts)
    for ticket, outcome in pool.drain():
        i = tickets[ticket]
        if isinstance(outcome, Raised):
            raise outcome.error
        weighed[i] = outcome.value if isinstance(outcome, Done) else weigh(parts[i], settings)
    return weighed


def layouts_or_failure(totals: dict, sample: SizeSample, config: BuildConfig):
    """The splits' layouts, or (tagged `failure`) the PlanError message saying why there are none."""
    try:
        yield run_plan.plan_layouts(
            totals, sample, expected_splits=[] if config.splits_from_data else [name for name, _ in config.splits],
            num_cores=config.num_cores, num_hosts=config.num_hosts,
            target_shard_bytes=int(config.target_shard_mb * plan.MB), forced=config.num_shards)
    except PlanError as exc:
        yield beam.pvalue.TaggedOutput("failure", str(exc))


def boundary_keys(chunk: list[Keyed], drafts: list[dict]) -> Iterable:
    """((split, bucket), order key) of the items in a bucket where some run starts."""
    keyed = KeyedItems.of(chunk)
    for layouts in drafts:  # none when planning failed
        for split, order in zip(keyed.splits, keyed.orders, strict=True):
            found = layouts.get(split)
            if found is not None and BoundaryFinder.wanted(found, order[0]):
                yield (split, run_plan.bucket_of(order[0], found.bucket_bits)), order


def pick_boundaries(grouped, drafts: list[dict]) -> Iterable:
    """(split, (slot, key)) of every run start in one bucket."""
    (split, bucket), keys = grouped
    for layouts in drafts:
        for slot, key in BoundaryFinder.picks(layouts[split], bucket, keys):
            yield split, (slot, key)


def with_boundaries(drafts: dict[str, SplitLayout], picks: list) -> dict[str, SplitLayout]:
    by_split: dict[str, list] = {}
    for split, pick in picks:
        by_split.setdefault(split, []).append(pick)
    return {split: BoundaryFinder.complete(layout, by_split.get(split, [])) for split, layout in drafts.items()}
