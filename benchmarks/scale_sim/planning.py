"""Per-item cost at scale: the build's own planning code over 10^6-10^7 simulated listed objects.

    python -m benchmarks.scale_sim.planning [--records 1000000,10000000] [--sample 100000] [--workers 1000]

Objects are named as a bucket in split and label folders names them (`train/label_017/00001234.jpg`, about
100 KB each). Every step is the project's code, on one core, timed in CPU seconds:

- per-item steps (listing's classify, keying, counting, the sample, BoundaryKeys, run assignment, the run
  writer's bookkeeping, a shard's copy, index rows and checksums) on `--sample` items against the layout
  of N items: their CPU per item must not grow with N;
- the steps that run in one place (merge of the listing's totals, layout, boundary completion, shard
  planning, publish plan) over all N items, in total CPU seconds;
- the largest element one worker holds in each grouped step (pickled bytes);
- the storage calls of the fixed steps (lock and output preflight, publish's plan, clear and commit),
  counted by a wrapper around the local storage backend, against a scratch output folder.

Random 64-bit keys stand in for the N items' hashes where all N are needed (the planner sees only keys);
the sampled items are hashed by the project's own `item_order`.
"""
from __future__ import annotations

import argparse
import functools
import pickle
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from beam_jobs import publish
from beam_jobs.jobs.checks import prepare_output
from beam_jobs.pipeline.common import SINGLETON_FANOUT
from beam_jobs.pipeline.encode import assign_runs
from beam_jobs.pipeline.listing import LIST_CHUNK
from beam_jobs.pipeline.plan_runs import ListingTotalsFn, SmallestFn, boundary_keys, key_chunk, pick_boundaries
from beam_jobs.pipeline.shards import plan_shards
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.tally import Tally
from shard_utils import storage
from shard_utils.format import schema
from shard_utils.format.manifest import IndexFile
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.inputs.listings import ListingOptions
from shard_utils.inputs.walk import sort_chunk
from shard_utils.media.encode import RecordMeta
from shard_utils.sharding import run_plan
from shard_utils.sharding.encode_run import item_order
from shard_utils.sharding.naming import ShardNaming
from shard_utils.sharding.runs import CHUNK_BYTES, RunFile, RunSummary, RunWriter
from shard_utils.sharding.shards import Piece, ShardPlan
from shard_utils.sharding.writer import ShardResult, ShardTask, write_shard
from shard_utils.storage import _local

SPLIT = "train"
LABELS = 100
MEAN_BYTES = 100_000
REJECTED = 0.01  # of the encoded items, rejected at random (shard planning deals with runs that fell short)
BUCKET = "gs://sim-bucket"
RUN_PART_RECORD = 200  # bytes of each stand-in record written by the run writer: bookkeeping, not I/O, dominates


def source_id(n: int) -> str:
    return f"{SPLIT}/label_{n % LABELS:03d}/{n:08d}.jpg"


def object_size(n: int) -> int:
    """50-150 KB, spread evenly, the same for the same object."""
    return 50_000 + (n * 7919) % 100_001


def sim_config(output: str = f"{BUCKET}/out") -> BuildConfig:
    return BuildConfig(input=f"{BUCKET}/images", output=output, temp_root=storage.join(output, ".tpu-shards-tmp"),
                       run_id="sim-run", created="2026-01-01T00:00:00Z", split_dirs=True, num_cores=8)


def sim_run(config: BuildConfig) -> RunInfo:
    return RunInfo(config.run_id or "sim-run", config.temp_dir(config.run_id or "sim-run"), config.created or "")


def stand_in_keys(n: int, seed: int = 0) -> np.ndarray:
    """n uniform 64-bit keys: what the seeded hashes of n distinct source ids look like to the planner."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(
        0, 2, size=n, dtype=np.int64).astype(np.uint64)


def pickled(value) -> int:
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


# ---------------------------------------------------------------------------------------------- all N items


@dataclass
class Planned:
    """What planning N items made, with the CPU seconds of each step and the largest grouped elements."""

    n: int
    draft: run_plan.SplitLayout  # before its run boundaries were found
    layout: run_plan.SplitLayout
    run_sizes: np.ndarray  # items per run, from the keys
    summaries: list[RunSummary]
    plans: dict
    tasks: list[ShardTask]
    times: dict[str, float] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)  # step -> pickled bytes of its largest element
    keys_grouped: int = 0


@contextmanager
def timed(times: dict[str, float], name: str) -> Iterator[None]:
    start = time.process_time()
    yield
    times[name] = times.get(name, 0.0) + time.process_time() - start


def plan_all(n: int, *, workers: int = 1000, shard_bytes: int = 128_000_000, seed: int = 0) -> Planned:
    """Layout, run boundaries and shard plan of n items, through the build's own steps (see the module's docstring)."""
    keys = stand_in_keys(n, seed)
    sizes = 50_000 + (np.arange(n, dtype=np.int64) * 7919) % 100_001  # object_size of every item
    times: dict[str, float] = {}
    config = sim_config()
    partial = []
    with timed(times, "count (parallel)"):
        count_fn = ListingTotalsFn(config.bucket_bits)
        for part, part_sizes in zip(np.array_split(keys, workers), np.array_split(sizes, workers), strict=True):
            totals = run_plan.ListingTotals(keys=run_plan.BucketCounts(config.bucket_bits))
            for lo in range(0, len(part), LIST_CHUNK * 64):  # a bundle of 64 chunks at a time
                totals.add(part[lo:lo + LIST_CHUNK * 64].tolist(), part_sizes[lo:lo + LIST_CHUNK * 64].tolist())
            partial.append({SPLIT: totals})
    with timed(times, "merge"):
        merged = count_fn.merge_accumulators(partial)
    with timed(times, "layout"):
        drafts = run_plan.plan_layouts(merged, run_plan.SizeSample(), expected_splits=[], num_cores=config.num_cores,
                                  num_hosts=config.num_hosts, target_shard_bytes=shard_bytes)
    draft = drafts[SPLIT]
    largest: dict[str, int] = {"layouts (side input)": pickled(drafts)}
    picks, grouped = boundary_picks(keys, drafts, times, largest)
    with timed(times, "complete"):
        layouts = {SPLIT: run_plan.BoundaryFinder.complete(draft, [pick for _, pick in picks])}
    largest["layouts (side input)"] = pickled(layouts)
    layout = layouts[SPLIT]
    run_sizes = np.bincount(np.searchsorted(np.array([k for k, _ in layout.boundaries], dtype=np.uint64), keys,
                                            side="right"), minlength=layout.num_runs)
    summaries = run_summaries(layout, run_sizes, sizes, np.random.default_rng(seed + 1))
    largest["a run's items (GroupRuns)"] = largest_run_items(int(run_sizes.max()))
    with timed(times, "plan shards"):
        out = list(plan_shards(summaries, [layouts], [], config, ShardNaming.for_build(config.shard_extension)))
    plans = next(o.value for o in out if getattr(o, "tag", None) == "plans")
    tasks = [o for o in out if isinstance(o, ShardTask)]
    largest["run summaries + layouts (PlanShards)"] = pickled((summaries, layouts))
    largest["shard plans (side input)"] = pickled(plans)
    largest["a shard task"] = max(pickled(t) for t in tasks)
    return Planned(n, draft, layout, run_sizes, summaries, plans, tasks, times, largest, grouped)


def boundary_picks(keys: np.ndarray, drafts: dict, times: dict, largest: dict) -> tuple[list, int]:
    """(split, (slot, key)) of every run start, bucket by bucket through `pick_boundaries`; and the keys grouped.
    Which keys reach the group step is what `BoundaryFinder.wanted` decides (timed per item on the sample)."""
    draft = drafts[SPLIT]
    buckets = (keys >> np.uint64(64 - draft.bucket_bits)).astype(np.int64)
    chosen = np.flatnonzero(np.isin(buckets, np.fromiter(draft.boundary_buckets, dtype=np.int64)))
    order = chosen[np.argsort(buckets[chosen], kind="stable")]
    ends = np.flatnonzero(np.diff(buckets[order])) + 1
    picks: list = []
    biggest = 0
    for group in np.split(order, ends):
        bucket = int(buckets[group[0]])
        bucket_keys = [(int(keys[i]), source_id(int(i))) for i in group]
        if len(group) > biggest:
            biggest = len(group)
            largest["a boundary bucket's keys (GroupBucket)"] = pickled(((SPLIT, bucket), bucket_keys))
        with timed(times, "boundary picks (parallel)"):
            picks += pick_boundaries(((SPLIT, bucket), bucket_keys), [drafts])
    return picks, len(chosen)


def run_summaries(layout: run_plan.SplitLayout, run_sizes: np.ndarray, sizes: np.ndarray,
                  rng: np.random.Generator) -> list[RunSummary]:
    """What each encoded run tells planning: its count (less its rejects) and its file, in parts on gs://."""
    folder = sim_config().temp_dir("sim-run")
    mean = int(sizes.mean()) + run_plan.RECORD_OVERHEAD
    out = []
    for run, items in enumerate(run_sizes.tolist()):
        count = items - int(rng.binomial(items, REJECTED))
        num_bytes = count * mean
        parts = tuple((storage.join(folder, "runs", SPLIT, f"{run:06d}.records", f"part-{p:05d}"),
                       min(CHUNK_BYTES, num_bytes - p * CHUNK_BYTES)) for p in range(-(-num_bytes // CHUNK_BYTES)))
        meta = storage.join(folder, "runs", SPLIT, f"{run:06d}.meta")
        out.append(RunSummary(SPLIT, run, RunFile(SPLIT, run, parts, meta, count, num_bytes) if count else None))
    return out


def largest_run_items(count: int) -> int:
    """Pickled bytes of a run's items as GroupRuns hands them to one encoder."""
    return pickled([media_items(range(count))])


# ---------------------------------------------------------------------------------------------- publish


def shard_results(planned: Planned, config: BuildConfig) -> list[ShardResult]:
    """The ShardResult each shard's writer would return (checksums stand in)."""
    out = []
    for task in planned.tasks:
        plan = task.plan
        per_label = Counter({label: plan.num_records // LABELS for label in range(LABELS)})
        per_label[0] += plan.num_records - sum(per_label.values())
        out.append(ShardResult(plan.split, plan.shard, storage.join(config.temp_dir("sim-run"), "shards", task.name),
                               task.name, plan.num_records, plan.num_records * (MEAN_BYTES + run_plan.RECORD_OVERHEAD),
                               "AAAAAA==", "0" * 64, tuple(sorted(per_label.items())),
                               storage.join(config.temp_dir("sim-run"), "index", task.name + ".avro"),
                               ((schema.LABEL, 1), (schema.LABEL_TEXT, 1)), place=task.place))
    return out


def publish_inputs(planned: Planned, config: BuildConfig) -> dict:
    """What `Publish/Everything` gathers for its plan: results, plans, and one rejection per item not written."""
    results = shard_results(planned, config)
    written = sum(r.num_records for r in results)
    rejected = [{"source": source_id(i), "reason": "corrupt", "message": "cannot identify image file"}
                for i in range(planned.n - written)]
    return {"results": results, "plans": [planned.plans], "failure": [], "rejected": rejected, "skipped_files": [],
            "tally": Tally(seen=planned.n), "labels": [f"label_{i:03d}" for i in range(LABELS)]}


def plan_publish(planned: Planned, config: BuildConfig) -> publish.Publication:
    found = publish_inputs(planned, config)
    planned.largest["Publish/Everything (one element)"] = pickled(found)
    with timed(planned.times, "publish plan"):
        pub = publish.plan_publication(found.pop("results"), config, run=sim_run(config), **found)
    planned.largest["the publication"] = pickled(pub)
    return pub


# ---------------------------------------------------------------------------------------------- storage calls


@contextmanager
def counting_storage() -> Iterator[Counter]:
    """Every call of the local storage backend's verbs, counted by name while the block runs."""
    calls: Counter = Counter()
    saved = {}
    for name in dir(_local):
        verb = getattr(_local, name)
        if name.startswith("_") or not callable(verb) or getattr(verb, "__module__", None) != _local.__name__:
            continue
        if isinstance(verb, type):
            continue
        saved[name] = verb

        def counted(*args, _verb=verb, _name=name, **kwargs):
            calls[_name] += 1
            return _verb(*args, **kwargs)

        setattr(_local, name, functools.wraps(verb)(counted))
    try:
        yield calls
    finally:
        for name, verb in saved.items():
            setattr(_local, name, verb)


def fixed_step_calls(planned: Planned) -> dict[str, int]:
    """Storage calls of the steps that run once, whatever the dataset's size: preflight and lock, the publish
    plan, clearing the output, and the commit (reports, TFDS files, manifest, the run's folder, the lock)."""
    with tempfile.TemporaryDirectory() as scratch:
        config = sim_config(output=storage.join(scratch, "out"))
        out: dict[str, int] = {}
        with counting_storage() as calls:
            prepare_output(config)
        out["preflight + lock"] = sum(calls.values())
        found = publish_inputs(planned, config)
        with counting_storage() as calls:
            pub = publish.plan_publication(found.pop("results"), config, run=sim_run(config), **found)
            publish.clear_output(pub, config)
            indexes = {job.split: IndexFile(job.name, job.rows, 1, "AAAAAA==", "0" * 64) for job in pub.indexes}
            publish.commit(pub, config, indexes)
        out["publish plan + clear + commit"] = sum(calls.values())
        out["moves and indexes (parallel, per shard / split)"] = len(pub.moves) + len(pub.indexes)
        return out


# ---------------------------------------------------------------------------------------------- per item


def media_items(numbers: Sequence[int] | range) -> list:
    """MediaItems of these objects, as the listing's classify step makes them."""
    root = f"{BUCKET}/images"
    return sort_chunk([storage.Entry(source_id(i), object_size(i)) for i in numbers], True, root,
                      ListingOptions()).media


def chunks_of(values: list, size: int = LIST_CHUNK) -> list[list]:
    return [values[i:i + size] for i in range(0, len(values), size)]


def per_item(step: Callable[[list], object], chunks: list[list]) -> float:
    """CPU microseconds per item of a step run over every chunk."""
    n = sum(len(c) for c in chunks)
    start = time.process_time()
    for chunk in chunks:
        step(chunk)
    return (time.process_time() - start) / max(1, n) * 1e6


def per_item_costs(planned: Planned, sample: int) -> dict[str, float]:
    """CPU microseconds per item of every per-item step, on `sample` items, against the layout of N items."""
    root = f"{BUCKET}/images"
    config = sim_config()
    drafts = {SPLIT: planned.draft}
    layouts = {SPLIT: planned.layout}
    numbers = list(range(sample))
    entries = chunks_of([storage.Entry(source_id(i), object_size(i)) for i in numbers])
    out = {"classify (listing)": per_item(lambda c: sort_chunk(c, True, root, ListingOptions()), entries)}
    media = chunks_of(media_items(numbers))
    keyed = [key_chunk(c, config.splits, config.seed) for c in media]
    out["key (split + order hash)"] = per_item(lambda c: key_chunk(c, config.splits, config.seed), media)
    planned.largest["keyed items of one WithSingleton key (streamed)"] = int(
        sum(pickled(c) for c in keyed) / sample * planned.n / SINGLETON_FANOUT)
    count_fn, smallest, totals = ListingTotalsFn(config.bucket_bits), SmallestFn(32), {}
    out["count (totals + key histogram)"] = per_item(lambda c: count_fn.add_input(totals, c), keyed)  # one bundle
    acc: list = []
    out["size sample (32 smallest)"] = per_item(lambda c: acc.__setitem__(slice(None), smallest.add_input(acc, c)),
                                                keyed)
    out["BoundaryKeys (wanted?)"] = per_item(lambda c: list(boundary_keys(c, [drafts])), keyed)
    out["assign to run (run_of)"] = per_item(lambda c: list(assign_runs(c, [layouts])), keyed)
    out.update(run_and_shard_costs(planned, [item for c in media for item in c], config.seed))
    return out


def merged_index_bytes(planned: Planned, index_part: str, records: int) -> int:
    """Bytes of the split's index that MergeIndex writes on one worker: each shard's part, at this part's
    bytes per record."""
    return int(storage.size(index_part) / records * planned.plans[SPLIT].num_records)


def run_and_shard_costs(planned: Planned, items: list, seed: int) -> dict[str, float]:
    """Per item: a run's sort and its writer's bookkeeping (stand-in records of RUN_PART_RECORD bytes), then a
    shard copied from two such runs (its runs' metadata, the copy, checksums, index rows)."""
    per_run = int(planned.run_sizes.max())
    runs = [items[:per_run], items[per_run:2 * per_run]]
    framed = b"\0" * RUN_PART_RECORD
    with tempfile.TemporaryDirectory() as folder:
        start = time.process_time()
        files = {}
        for run, members in enumerate(runs):
            writer = RunWriter(folder, SPLIT, run)
            for item in sorted(members, key=lambda item: item_order(item, seed)):
                key, source = item_order(item, seed)
                writer.add(framed, RecordMeta(key, source, len(framed), (0,), "0" * 64, 480, 640))
            files[run] = writer.close()
        encoded = (time.process_time() - start) / sum(map(len, runs)) * 1e6
        half = len(runs[1]) // 2
        pieces = (Piece(0, half, len(runs[0]) - half), Piece(1, 0, half))
        plan = ShardPlan(SPLIT, 0, 2, pieces, prefix=False)
        task = ShardTask(plan, TFRECORD.shard_name(SPLIT, 0, 2), 0, files)
        start = time.process_time()
        written = write_shard(task, folder)
        copied = (time.process_time() - start) / written.num_records * 1e6
        planned.largest["a split's index (MergeIndex, streamed)"] = merged_index_bytes(
            planned, written.index_part, written.num_records)
    return {f"run sort + writer bookkeeping (runs of {per_run})": encoded,
            "shard copy + checksums + index rows": copied}


# ---------------------------------------------------------------------------------------------- accounting


def check_accounting(planned: Planned) -> list[str]:
    """What does not close: every item in exactly one run (runs equal within one item), every usable record in
    exactly one shard (shards equal within one), every shard's pieces within its runs' counts."""
    problems = []
    if int(planned.run_sizes.sum()) != planned.n:
        problems.append(f"{planned.run_sizes.sum()} items in runs, {planned.n} listed")
    if planned.run_sizes.max() - planned.run_sizes.min() > 1:
        problems.append(f"runs of {planned.run_sizes.min()} to {planned.run_sizes.max()} items")
    usable = sum(s.count for s in planned.summaries)
    split = planned.plans[SPLIT]
    if sum(split.sizes) != usable or split.num_records != usable:
        problems.append(f"{sum(split.sizes)} records in shards, {usable} usable")
    if max(split.sizes) - min(split.sizes) > 1:
        problems.append(f"shards of {min(split.sizes)} to {max(split.sizes)} records")
    taken: Counter = Counter()
    for shard in split.shards:
        for piece in shard.pieces:
            taken[piece.run] += piece.count
    over = [s.run for s in planned.summaries if taken[s.run] != s.count]
    if over:
        problems.append(f"{len(over)} runs not taken whole (e.g. run {over[0]})")
    return problems


# ---------------------------------------------------------------------------------------------- the table


SERIAL = ("merge", "layout", "complete", "plan shards")
PLANNING = ("key (split + order hash)", "count (totals + key histogram)", "size sample (32 smallest)",
            "BoundaryKeys (wanted?)", "assign to run (run_of)")  # the per-item steps of planning and layout


def simulate(n: int, *, sample: int, workers: int) -> dict:
    """Everything the table shows for n items."""
    planned = plan_all(n, workers=workers)
    config = sim_config()
    plan_publish(planned, config)
    costs = per_item_costs(planned, sample)
    return {"planned": planned, "per_item": costs, "calls": fixed_step_calls(planned),
            "problems": check_accounting(planned)}


def report(found: dict) -> list[str]:
    planned: Planned = found["planned"]
    layout, t = planned.layout, planned.times
    lines = [f"{planned.n:>12,} items: {layout.num_shards} shards planned, {layout.num_runs} runs, "
             f"{planned.plans[SPLIT].num_shards} shards written, {planned.keys_grouped:,} keys grouped "
             f"({planned.keys_grouped / planned.n:.1%}); accounting: "
             + ("closes" if not found["problems"] else "; ".join(found["problems"])),
             "  CPU per item (us), sampled:"]
    lines += [f"    {name:<48} {us:8.2f}" for name, us in found["per_item"].items()]
    lines.append("  CPU in one place (s):")
    serial = sum(t[name] for name in SERIAL)
    lines += [f"    {name:<48} {t[name]:8.2f}" for name in (*SERIAL, "publish plan")]
    lines.append(f"    {'plan and layout, serial total':<48} {serial:8.2f}")
    lines.append("  CPU spread over workers, total (s):")
    lines += [f"    {name:<48} {t[name]:8.2f}" for name in ("count (parallel)", "boundary picks (parallel)")]
    per_item = sum(found["per_item"][name] for name in PLANNING) * planned.n / 1e6
    lines.append(f"    {'plan and layout in all (per item x N + serial)':<48} "
                 f"{per_item + serial + t['boundary picks (parallel)']:8.2f}")
    lines.append("  largest element one worker holds (pickled bytes):")
    lines += [f"    {name:<48} {size:>12,}" for name, size in planned.largest.items()]
    lines.append("  storage calls of the fixed steps:")
    lines += [f"    {name:<48} {calls:>12,}" for name, calls in found["calls"].items()]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000,10000000", help="item counts, comma-separated")
    ap.add_argument("--sample", type=int, default=100_000, help="items each per-item step is timed on")
    ap.add_argument("--workers", type=int, default=1000, help="partial totals merged (workers x bundles)")
    args = ap.parse_args(argv)
    for n in (int(x) for x in args.records.split(",")):
        print("\n".join(report(simulate(n, sample=min(args.sample, n), workers=min(args.workers, n)))), flush=True)


if __name__ == "__main__":
    main()
