"""Where a local build's time per image goes, step by step, for this checkout and another revision.

    python benchmarks/bench_steps.py [--rev 1cf5358] [--path structure] [--count 3000] [--tiny 64] [--reps 5] [--cpu]

Each tree builds --tiny and --count images of the path's kind --reps times, each build in a fresh process that
times the bundles of every step (build_bench/steps_child.py, from that tree). For each step it prints the
fastest time at both sizes and the difference: what the step costs for the extra images. The machine may be
shared, so each figure is the best of the reps; steps are measured separately, so their differences need not
add up to the total's. The other revision is checked out as bench_versions.py does. With --cpu each figure is
the driver's main-thread CPU seconds instead of wall time (its own work per step, without the waits for the
encode workers).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from bench_versions import DEFAULT_REV, checkout, run_child  # noqa: E402
from build_bench import data  # noqa: E402
from build_bench.bench import JOB_PATHS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=DEFAULT_REV)
    ap.add_argument("--path", default="structure", choices=sorted(JOB_PATHS))
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--tiny", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="the driver's main-thread CPU seconds, not wall time")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-versions"))
    args = ap.parse_args()
    if not 0 < args.tiny < args.count or args.reps < 1 or args.workers < 1:
        ap.error("need 0 < --tiny < --count, --reps >= 1 and --workers >= 1")
    work = Path(args.work)
    if args.cpu:
        os.environ["STEPS_CLOCK"] = "cpu"  # the children read it (build_bench/steps_child.py)
    kind, flags, what = JOB_PATHS[args.path]
    trees = {"this checkout": HERE.parent, args.rev: checkout(args.rev, work)}
    best: dict[tuple[str, int], dict[str, float]] = {}
    for rep in range(args.reps):
        for count in (args.tiny, args.count):
            source = data.input_folder(work, kind, count, args.workers)
            for name, tree in (list(trees.items()) if rep % 2 == 0 else list(trees.items())[::-1]):
                found = run_child(tree, HERE, "build_bench.steps_child", source, work / "out" / f"steps-{count}",
                                  args.workers, flags)
                mins = best.setdefault((name, count), {})
                for step, seconds in found.items():
                    mins[step] = min(mins.get(step, float("inf")), seconds)
                print(f"rep {rep + 1} {count:>6} images  {name:<14} {found['total']:6.2f} s", file=sys.stderr,
                      flush=True)
    extra = args.count - args.tiny
    clock = "driver main-thread CPU seconds" if args.cpu else "seconds"
    print(f"\n{what}, {args.workers} workers: {clock} per step, best of {args.reps} (the difference is the cost of "
          f"{extra} more images, and ms per 1,000 images)")
    for name in trees:
        small, large = best[name, args.tiny], best[name, args.count]
        print(f"\n{name}\n{'step':<34} {args.tiny:>8} {args.count:>8} {'extra':>8} {'ms/1000':>8}")
        for step in sorted(set(small) | set(large), key=lambda s: (s == "total", -large.get(s, 0))):
            a, b = small.get(step, 0.0), large.get(step, 0.0)
            if max(a, b) >= 0.01 or step == "total":
                print(f"{step:<34} {a:8.3f} {b:8.3f} {b - a:+8.3f} {1000 * (b - a) / extra * 1000:8.1f}")


if __name__ == "__main__":
    main()
