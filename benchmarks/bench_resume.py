"""Resumable training input against today's make_dataset, side by side in one process on the same shards.

Steady throughput: make_dataset(seed=0, start_step=0) (deterministic epochs, read through the index) against
make_dataset() (shuffled shards and records, order left to thread timing), both decoding, resizing to --resize,
scaling and batching --batch. Time to first batch: from make_dataset(..., start_step=K) to its first batch, at
K = 0 and at K = 90 % of an epoch. Rounds alternate between candidates so machine load hits all alike; medians.

    python benchmarks/bench_resume.py --data /tmp/bench      # the 1,024 photo-like 400x400 JPEGs of bench_loader
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import build, throughput  # noqa: E402


def first_batch_seconds(make) -> float:
    """Seconds from building a dataset (manifest already loaded) to holding its first batch."""
    start = time.perf_counter()
    next(iter(make()))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for generated images and shards (default: a temp dir)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--source-size", type=int, default=400)
    ap.add_argument("--resize", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=32, help="timed batches per round (default 32)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_resume_"))
    data.mkdir(parents=True, exist_ok=True)
    dataset = build(data, args.images, args.source_size)

    import tensorflow as tf

    from shard_utils import loader

    m = loader.load_manifest(str(dataset))
    split = "train" if "train" in m.splits else sorted(m.splits)[0]
    late = int(0.9 * loader.steps_per_epoch(m, split, args.batch))

    def resumable(start: int):
        return lambda: loader.make_dataset(m, split, args.batch, image_size=args.resize, seed=0, start_step=start)

    steady = {"make_dataset() (today)": lambda: loader.make_dataset(m, split, args.batch, image_size=args.resize),
              "make_dataset(seed=0, start_step=0)": resumable(0)}
    first = {"start_step=0": resumable(0), f"start_step={late} (90 % of an epoch)": resumable(late)}
    speeds: dict[str, list[tuple[float, float]]] = {name: [] for name in steady}
    waits: dict[str, list[float]] = {name: [] for name in first}
    for _ in range(args.rounds):
        for name, make in steady.items():
            speeds[name].append(throughput(make(), args.batch, args.batches, warmup=4))
        for name, make in first.items():
            waits[name].append(first_batch_seconds(make))

    today, new = (speeds[name] for name in steady)
    print(f"\n{m.num_records(split)} records in {len(m.shard_paths(split))} shards, {args.source_size}x"
          f"{args.source_size} JPEG -> {args.resize}x{args.resize} float32, batch {args.batch}; TF {tf.__version__}, "
          f"{os.cpu_count()} CPUs; median of {args.rounds} alternating rounds")
    print(f"{'steady throughput':40} {'images/s':>9} {'CPU ms/image':>13}   images/s per round")
    for name, runs in speeds.items():
        print(f"{name:40} {statistics.median(r[0] for r in runs):9.0f} {statistics.median(r[1] for r in runs):13.2f}"
              f"   {' '.join(f'{r[0]:.0f}' for r in runs)}")
    ratio = statistics.median(n[0] / t[0] for n, t in zip(new, today, strict=True))
    print(f"{'resumable / today (paired, target >= 0.9)':40} {ratio:9.2f}x")
    print(f"{'time to first batch':40} {'seconds':>9}   per round")
    for name, runs in waits.items():
        print(f"{name:40} {statistics.median(runs):9.2f}   {' '.join(f'{r:.2f}' for r in runs)}")
    zero, ninety = waits.values()
    late_ratio = statistics.median(b / a for a, b in zip(zero, ninety, strict=True))
    print(f"{'90 % / 0 (paired, target <= 1.5)':40} {late_ratio:9.2f}x")


if __name__ == "__main__":
    sys.exit(main())
