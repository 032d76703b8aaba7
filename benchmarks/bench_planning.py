"""Planning a split of 10^6 and 10^7 records: the parts of the graph that run in one place.

    python benchmarks/bench_planning.py [--records 1000000,10000000] [--workers 1000] [--shard-mb 128]

The steps are the scale simulator's (`benchmarks.scale_sim.planning`, which also times every per-item
step); this prints only what runs serially, timed on one core:
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scale_sim.planning import SERIAL, plan_all  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000,10000000")
    ap.add_argument("--workers", type=int, default=1000, help="partial totals merged (workers x bundles)")
    ap.add_argument("--shard-mb", type=float, default=128.0)
    args = ap.parse_args()
    for n in (int(x) for x in args.records.split(",")):
        found = plan_all(n, workers=args.workers, shard_bytes=int(args.shard_mb * 1e6))
        times = found.times
        serial = sum(times[name] for name in SERIAL)
        print(f"{n:>12,} records: {found.plans['train'].num_shards} shards, {found.layout.num_runs} runs, "
              f"{found.keys_grouped:,} keys grouped ({found.keys_grouped / n:.2%}), "
              f"{len(found.layout.boundaries or ())} boundary keys out of the group step")
        for name in (*SERIAL, "count (parallel)", "boundary picks (parallel)"):
            print(f"    {name:<38} {times[name]:8.3f} s")
        print(f"    {'serial total':<38} {serial:8.3f} s")
        if n >= 10**7:
            print(f"    target (serial part under 10 s at 10^7): {'met' if serial < 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
