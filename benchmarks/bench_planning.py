"""Planning a split of 10^6 and 10^7 records: the parts of the graph that run in one place.

    python benchmarks/bench_planning.py [--records 1000000,10000000] [--workers 1000] [--shard-mb 128]

A record's place is a seeded hash of its source id (uniform 64-bit keys; random ones stand in for the
hashes here, since the planner sees only keys). What the graph does serially, timed on one core:
  merge     the listing's per-worker totals (counts and key histograms) combined into one
  layout    the shard count and where each run starts (bucket and position)
  complete  the run boundaries assembled from the picks of every boundary bucket
  plan shards  the exact shard sizes and pieces from the runs' counts
What runs in parallel over workers is timed too, as total CPU, for scale: counting keys per chunk, picking
the boundary keys of each bucket. The target: the serial part under 10 s at 10^7 records.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shard_utils.sharding import layout as lay  # noqa: E402
from shard_utils.sharding.shards import RunCount, plan_split_shards  # noqa: E402

CHUNK = 256  # items per listed chunk, as ListMedia emits them


def plan_once(n: int, workers: int, shard_bytes: int, record_bytes: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(
        0, 2, size=n, dtype=np.int64).astype(np.uint64)
    times: dict[str, float] = {}

    # Parallel: each worker counts its chunks (numpy over each chunk's keys).
    start = time.process_time()
    partial = []
    per_worker = np.array_split(keys, workers)
    for part in per_worker:
        totals = lay.ListingTotals(keys=lay.BucketCounts())
        for lo in range(0, len(part), CHUNK * 64):  # a bundle of 64 chunks at a time
            block = part[lo:lo + CHUNK * 64]
            totals.add(block.tolist(), [record_bytes] * len(block))
        partial.append(totals)
    times["count (parallel, total CPU)"] = time.process_time() - start

    start = time.process_time()
    total = lay.ListingTotals(keys=lay.BucketCounts())
    for t in partial:
        total.merge(t)
    times["merge"] = time.process_time() - start

    start = time.process_time()
    layout = lay.plan_layout("train", total, lay.SizeSample(), num_cores=8, num_hosts=1,
                             target_shard_bytes=shard_bytes)
    times["layout"] = time.process_time() - start

    # Parallel: only keys of boundary buckets go to the group step; each bucket's keys are sorted there.
    start = time.process_time()
    wanted = np.isin((keys >> np.uint64(64 - layout.bucket_bits)).astype(np.int64),
                     np.fromiter(layout.boundary_buckets, dtype=np.int64))
    chosen = keys[wanted]
    buckets = (chosen >> np.uint64(64 - layout.bucket_bits)).astype(np.int64)
    picks = []
    for bucket in np.unique(buckets):
        bucket_keys = [(int(k), f"img{int(k) % 10**9:09d}.jpg") for k in chosen[buckets == bucket]]
        picks += lay.BoundaryFinder.picks(layout, int(bucket), bucket_keys)
    times["boundary picks (parallel, total CPU)"] = time.process_time() - start
    grouped = int(wanted.sum())

    start = time.process_time()
    layout = lay.BoundaryFinder.complete(layout, picks)
    times["complete"] = time.process_time() - start

    # Every run's usable count (1 % rejected at random), then the shards.
    sizes = np.bincount(np.searchsorted(np.array([k for k, _ in layout.boundaries], dtype=np.uint64), keys,
                                        side="right"), minlength=layout.num_runs)
    counts = [RunCount(r, int(c) - int(rng.binomial(int(c), 0.01))) for r, c in enumerate(sizes)]
    start = time.process_time()
    planned = plan_split_shards(layout, counts, num_cores=8, num_hosts=1)
    times["plan shards"] = time.process_time() - start
    serial = times["merge"] + times["layout"] + times["complete"] + times["plan shards"]
    return {**times, "serial total": serial, "runs": layout.num_runs, "shard count": planned.num_shards,
            "keys grouped": grouped, "boundary keys out": len(layout.boundaries)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000,10000000")
    ap.add_argument("--workers", type=int, default=1000, help="partial totals merged (workers x bundles)")
    ap.add_argument("--shard-mb", type=float, default=128.0)
    ap.add_argument("--record-kb", type=float, default=150.0, help="bytes per record the estimate sees")
    args = ap.parse_args()
    for n in (int(x) for x in args.records.split(",")):
        found = plan_once(n, args.workers, int(args.shard_mb * 1e6), int(args.record_kb * 1000))
        print(f"{n:>12,} records: {found['shard count']} shards, {found['runs']} runs, "
              f"{found['keys grouped']:,} keys grouped ({found['keys grouped'] / n:.2%}), "
              f"{found['boundary keys out']} boundary keys out of the group step")
        for name in ("merge", "layout", "complete", "plan shards", "serial total", "count (parallel, total CPU)",
                     "boundary picks (parallel, total CPU)"):
            print(f"    {name:<38} {found[name]:8.3f} s")
        verdict = "met" if found["serial total"] < 10 else "NOT met"
        print(f"    target (serial part under 10 s at 10^7): {verdict}" if n >= 10**7 else "", end="")
        print()


if __name__ == "__main__":
    main()
