"""Local build throughput of this checkout against another revision's, on the same images, in one run.

    python benchmarks/bench_versions.py [--rev 1cf5358] [--count 2000] [--tiny 64] [--rounds 2] [--workers 2]

The other revision is checked out (detached) under --work once. Each round builds every path with both
trees, alternating which goes first; each tree's build runs in a fresh process that imports Beam and the job
before its clock starts (build_bench/job_child.py, from that tree). Steady throughput subtracts each tree's
fixed cost, measured on --tiny images of the same kind: (count - tiny) / (t(count) - t(tiny)). The machine may
be shared: read the ratio, best of --rounds. CPU per image with the fixed cost subtracted:
(cpu(count) - cpu(tiny)) / (count - tiny), each the least of the rounds. The default revision is the last one
before local and Dataflow builds ran one graph (local builds then took a write-once path of their own).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from build_bench import data  # noqa: E402
from build_bench.bench import JOB_PATHS  # noqa: E402

DEFAULT_REV = "1cf5358"


def checkout(rev: str, work: Path) -> Path:
    """A detached worktree of `rev` under work (made once)."""
    tree = work / f"rev-{rev}"
    if not (tree / "beam_jobs").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(tree), rev], check=True,
                       capture_output=True)
    return tree


def run_child(tree: Path, scripts: Path, module: str, source: Path, out: Path, workers: int,
              flags: tuple[str, ...]) -> dict:
    """What `python -m module RESULT.json -- JOB ARGS` writes to RESULT.json after one build by the tree's own code
    (module: a child script of the build_bench package found in `scripts`)."""
    result = out.with_suffix(".json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(scripts)]), "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONHASHSEED": "0"}
    args = ["--", "--input", str(source), "--output", str(out), "--overwrite", "--no-progress", "--workers",
            str(workers), *flags]
    done = subprocess.run([sys.executable, "-m", module, str(result), *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build by {tree} failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    return json.loads(result.read_text())


def timed_build(tree: Path, source: Path, out: Path, workers: int, flags: tuple[str, ...]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the build and its worker processes) of one build by the tree's own code."""
    found = run_child(tree, tree / "benchmarks", "build_bench.job_child", source, out, workers, flags)
    return found["seconds"], found["cpu_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=DEFAULT_REV)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--tiny", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--paths", default="reencode,decode,structure")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-versions"))
    args = ap.parse_args()
    work = Path(args.work)
    trees = {"this checkout": REPO, args.rev: checkout(args.rev, work)}
    best: dict[tuple[str, str, int], float] = {}
    cpu: dict[tuple[str, str, int], float] = {}
    for round_ in range(args.rounds):
        for path in args.paths.split(","):
            kind, flags, _ = JOB_PATHS[path]
            for count in (args.tiny, args.count):
                source = data.input_folder(work, kind, count, args.workers)
                order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    seconds, cpu_seconds = timed_build(tree, source, work / "out" / f"{path}-{count}", args.workers,
                                                       flags)
                    key = (name, path, count)
                    best[key] = min(best.get(key, float("inf")), seconds)
                    cpu[key] = min(cpu.get(key, float("inf")), cpu_seconds)
                    print(f"round {round_ + 1} {path:<9} {count:>6} images  {name:<14} {seconds:6.2f} s",
                          file=sys.stderr, flush=True)
    print(f"\nsteady local throughput, {args.workers} workers, best of {args.rounds} rounds "
          f"({args.count} images, fixed cost from {args.tiny}): images/s")
    print(f"{'path':<10} {'this checkout':>14} {args.rev:>14} {'ratio':>7}   images per CPU-second (all processes, "
          f"{args.count} images), then CPU ms per image with the fixed cost subtracted: this checkout, {args.rev}")
    for path in args.paths.split(","):
        rates = {name: (args.count - args.tiny) / (best[name, path, args.count] - best[name, path, args.tiny])
                 for name in trees}
        per_cpu = {name: args.count / cpu[name, path, args.count] for name in trees}
        steady_ms = {name: 1000 * (cpu[name, path, args.count] - cpu[name, path, args.tiny]) / (args.count - args.tiny)
                     for name in trees}
        print(f"{path:<10} {rates['this checkout']:>14.0f} {rates[args.rev]:>14.0f} "
              f"{rates['this checkout'] / rates[args.rev]:>7.2f}   "
              f"{per_cpu['this checkout']:.0f}, {per_cpu[args.rev]:.0f}; "
              f"{steady_ms['this checkout']:.3f}, {steady_ms[args.rev]:.3f}")
    fixed = {name: min(best[name, p, args.tiny] for p in args.paths.split(",")) for name in trees}
    print("fixed cost (the fastest build of --tiny images): " + ", ".join(f"{n} {s:.2f} s" for n, s in fixed.items()))


if __name__ == "__main__":
    main()
