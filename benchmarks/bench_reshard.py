"""Reshard and append wall time, two source trees side by side (e.g. a branch against main), in alternating rounds.

One dataset is built once (by the first tree) from photo-like JPEGs, kept as they are; then each round runs,
for each tree in turn (the order flips every round), `tpu-shards reshard` of it to another topology and
`tpu-shards build --append` of new files to a copy of it, each in a fresh process and output folder. The shard
files both trees write are compared byte for byte. The ratio of the medians (second tree / first) is the
result; on a shared machine read the CPU seconds (the job's and its workers'), which vary far less than wall.

    python benchmarks/bench_reshard.py --trees /work/wt/base /work/wt/branch --count 2000 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from conftest import write_images  # noqa: E402

LABELS = ("cat", "dog", "fish", "bird")


def cli(tree: Path, *args: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of it and its worker processes) of `tpu-shards ARGS` run from `tree` in a fresh
    process (one line and exit on failure). On a shared machine the CPU seconds vary much less than the wall's."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "beam_jobs.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tree)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{tree}: tpu-shards {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".tfrecord", ".avro", ".ar")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, type=Path, required=True, help="two source trees: baseline, candidate")
    ap.add_argument("--count", type=int, default=2000, help="images in the dataset")
    ap.add_argument("--new", type=int, default=200, help="images the append adds")
    ap.add_argument("--size", type=int, nargs=2, default=(320, 240))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, help="keep images and the source dataset here (default: a temp dir)")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="bench_reshard-"))
    images = data / f"images-{args.count}"
    if not images.exists():
        per = {label: args.count // len(LABELS) + (i < args.count % len(LABELS)) for i, label in enumerate(LABELS)}
        write_images(images, per, size=tuple(args.size))
    grown = data / f"grown-{args.count}-{args.new}"
    if not grown.exists():
        shutil.copytree(images, grown)
        write_images(grown / "new", {"cat": args.new}, size=tuple(args.size), seed=90_000)
    source = data / f"source-{args.count}-kept"
    if not source.exists():
        cli(args.trees[0], "build", "--input", str(images), "--output", str(source), "--num-cores", "8")
    times: dict[tuple[int, str], list[tuple[float, float]]] = {}
    made: dict[tuple[int, str], dict[str, bytes]] = {}
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for t in order:
            out = data / f"out-{r}-{t}"
            shutil.rmtree(out, ignore_errors=True)
            times.setdefault((t, "reshard"), []).append(
                cli(args.trees[t], "reshard", str(source), str(out / "resharded"), "--num-cores", "4",
                    "--num-hosts", "2"))
            shutil.copytree(source, out / "appended")
            times.setdefault((t, "append"), []).append(
                cli(args.trees[t], "build", "--input", str(grown), "--output", str(out / "appended"), "--append"))
            for job in ("reshard", "append"):
                made[(t, job)] = shard_bytes(out / ("resharded" if job == "reshard" else "appended"))
    print(f"{args.count} images of {args.size[0]}x{args.size[1]} (append: +{args.new}), {args.rounds} rounds, "
          f"alternating; per job: median wall s, median CPU s (all rounds' wall)")
    for job in ("reshard", "append"):
        (bw, bc), (cw, cc) = ((statistics.median(w for w, _ in times[(t, job)]),
                               statistics.median(c for _, c in times[(t, job)])) for t in (0, 1))
        same = made[(0, job)] == made[(1, job)]
        walls = [[round(w, 1) for w, _ in times[(t, job)]] for t in (0, 1)]
        print(f"  {job:8s} {args.trees[0].name}: {bw:6.2f} s, CPU {bc:6.2f} s {walls[0]}"
              f"  {args.trees[1].name}: {cw:6.2f} s, CPU {cc:6.2f} s {walls[1]}"
              f"  ratio wall {cw / bw:.3f}, CPU {cc / bc:.3f}; same shard bytes: {same}")
    if not args.data:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
