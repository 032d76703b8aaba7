"""A build with fewer runs than workers, before and after runs were encoded in parts: this checkout against
another tree of the code (--before), rounds alternating between them, wall and CPU time of each build.

    git archive <commit> | tar -x -C /tmp/before
    python benchmarks/bench_parts.py --before /tmp/before [--count 2000] [--rounds 3] [--num-cores 1] [--workers 2]

Each build runs in a fresh process of its tree that imports Beam before its clock starts (build_bench's
job_child); CPU is user + system time of the build and its encode workers. ~400x400 photo-like images
(build_bench's cache): re-encode (PNG in, --jpeg-quality 75) and pass-through (JPEG in, --validate decode).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from build_bench import data  # noqa: E402
from build_bench.bench import JOB_PATHS, log  # noqa: E402

PATHS = ("reencode", "decode")


def timed_build(tree: Path, source: Path, out: Path, result: Path, flags: list[str]) -> dict:
    """One build by the code of `tree`, in a fresh process: {"seconds", "cpu_seconds", ...}."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "benchmarks")]),
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONHASHSEED": "0"}
    args = ["--input", str(source), "--output", str(out), "--overwrite", "--no-progress", *flags]
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "build_bench.job_child", str(result), "--", *args], cwd=tree,
                          env=env, capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode or not result.exists():
        raise SystemExit(f"build by {tree} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a tree of the code to compare against (e.g. git archive of main)")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-cores", type=int, default=1, help="the build's --num-cores (1: one shard, one run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tpu-shards-bench"),
                    help="build_bench's work folder: its cached images, and these builds' outputs")
    args = ap.parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": HERE.parent}
    work = Path(args.work).resolve()
    flags = ["--num-cores", str(args.num_cores), "--workers", str(args.workers)]
    sources = {path: data.input_folder(work, JOB_PATHS[path][0], args.count, os.cpu_count() or 1) for path in PATHS}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    load = os.getloadavg()
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for path in PATHS:
            for name in order:
                log(f"round {r + 1}: {path}, {name}")
                got = timed_build(trees[name], sources[path], work / "out" / f"parts-{name}",
                                  work / "logs" / f"parts-{name}.json", [*JOB_PATHS[path][1], *flags])
                times.setdefault((path, name), []).append((got["seconds"], got["cpu_seconds"]))
    print(f"{args.count} images, {' '.join(flags)}, median of {args.rounds} alternating rounds; "
          f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"{'path':10} {'code':7} {'wall s':>7} {'img/s':>6} {'CPU s':>6}   rounds (wall s / CPU s)")
    for path in PATHS:
        for name in trees:
            walls, cpus = zip(*times[path, name], strict=True)
            wall = statistics.median(walls)
            print(f"{path:10} {name:7} {wall:7.2f} {args.count / wall:6.0f} {statistics.median(cpus):6.1f}   "
                  + " ".join(f"{w:.2f}/{c:.1f}" for w, c in zip(walls, cpus, strict=True)))
        before, after = (statistics.median(w for w, _ in times[path, n]) for n in trees)
        print(f"{path:10} after / before: {before / after:.2f}x the images a second")


if __name__ == "__main__":
    main()
