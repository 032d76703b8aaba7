"""The build driver's own CPU per listed image (listing, keys, plan, runs: the serial work before and between the
encode workers' runs): this checkout against another tree of the code (--before), rounds alternating between them.

    git archive main | tar -x -C /tmp/driver_main
    python benchmarks/bench_driver.py --before /tmp/driver_main --large /tmp/peers_20k/inputs/jpg-20000 \
        --small /tmp/peers_20k/inputs/jpg-64 [--rounds 6] [--workers 2]

Each round builds the small folder and the large one with each tree, pass-through (--validate structure), each
build in a fresh process of its tree that imports Beam before its clock starts (build_bench's job_child). The
driver's CPU per image is (large - small) driver CPU (that process alone, not its encode workers) over
(large - small) images: what is fixed (start-up, graph, the last steps) cancels out. Printed per round, then
medians and the large build's wall, with the load average (on a shared machine, compare medians side by side).
Read the large folder once before (`cat ... > /dev/null`): the first round would otherwise read cold files.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from bench_parts import timed_build  # noqa: E402

FLAGS = ["--validate", "structure"]


def files_under(folder: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(folder))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a tree of the code to compare against (e.g. git archive of main)")
    ap.add_argument("--large", required=True, type=Path, help="a folder of many images (e.g. 20,000)")
    ap.add_argument("--small", required=True, type=Path, help="a folder of a few images (e.g. 64)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.workers < 1:
        raise SystemExit("--rounds and --workers must be at least 1")
    trees = {"before": Path(args.before).resolve(), "after": HERE.parent}
    images = {"small": files_under(args.small), "large": files_under(args.large)}
    if images["large"] <= images["small"]:
        raise SystemExit(f"--large holds {images['large']} files, --small {images['small']}: large must hold more")
    flags = [*FLAGS, "--workers", str(args.workers)]
    per_image: dict[str, list[float]] = {name: [] for name in trees}
    walls: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench_driver_") as work:
        for r in range(1, args.rounds + 1):
            for name, tree in trees.items():
                got = {size: timed_build(tree, getattr(args, size), Path(work) / "out", Path(work) / "result.json",
                                         flags) for size in ("small", "large")}
                us = (got["large"]["driver_cpu_seconds"] - got["small"]["driver_cpu_seconds"]) * 1e6 / (
                    images["large"] - images["small"])
                per_image[name].append(us)
                walls[name].append(got["large"]["seconds"])
                print(f"round {r} {name:6s}: driver {us:5.1f} us/image, large build wall "
                      f"{got['large']['seconds']:.2f} s, driver CPU small {got['small']['driver_cpu_seconds']:.2f} s "
                      f"large {got['large']['driver_cpu_seconds']:.2f} s", flush=True)
    for name in trees:
        print(f"{name:6s}: driver {statistics.median(per_image[name]):.1f} us/image (median of {args.rounds}), "
              f"{images['large']:,}-image build wall {statistics.median(walls[name]):.2f} s")
    before, after = (statistics.median(per_image[n]) for n in trees)
    print(f"after / before: {after / before:.2f}x driver CPU per image; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
