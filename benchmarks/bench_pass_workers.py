"""Pass-through builds over several worker counts, this tree against another, alternating: where parts stop paying.

    python benchmarks/bench_pass_workers.py [--count 20000] [--workers 2,8,16] [--rounds 2] --against TREE
        [--work DIR] [--json FILE]

Each round builds, for each worker count and each tree (the order turning), `tpu-shards build --validate structure`
of 64 images and of `--count` images (~35 KB JPEGs in 10 class folders: 200 made once, each copied to count / 200
files). Printed per worker count and tree: the walls, the steady wall and CPU per image (large less small, over the
images between them; CPU of the build and every process it waited for) and how long the driver worked alone after the
pool's first work (sampled from /proc every 50 ms: the serial part that more workers do not shorten). Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = 200  # distinct images; the rest are copies (a pass-through's cost does not depend on the pixels)
TINY = 64


def make_images(root: Path, count: int) -> Path:
    """`count` JPEGs under root/data/class<k>/, made once (root/done marks them)."""
    import numpy as np
    from PIL import Image

    data = root / "data"
    done = root / f"done-{count}"
    if done.exists():
        return data
    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(0)
    seeds = []
    for i in range(SEEDS):
        base = rng.integers(0, 255, (25, 25, 3), dtype=np.uint8)
        picture = Image.fromarray(base).resize((400 + i % 7 * 8, 400), Image.Resampling.BICUBIC)
        path = root / f"seed{i}.jpg"
        root.mkdir(parents=True, exist_ok=True)
        picture.save(path, quality=90)
        seeds.append(path.read_bytes())
    for k in range(count):
        folder = data / f"class{k % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:06d}.jpg").write_bytes(seeds[k % SEEDS])
    done.write_text("ok")
    return data


def tiny_copy(data: Path, root: Path) -> Path:
    """The first TINY images of data, under root/tiny."""
    tiny = root / "tiny"
    if not tiny.exists():
        for k in range(TINY):
            folder = tiny / f"class{k % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(data / f"class{k % 10}" / f"{k:06d}.jpg", folder)
    return tiny


def ticks(root_pid: int) -> dict[int, int]:
    """CPU ticks so far of root_pid and every process below it."""
    found: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, grew = {root_pid}, True
    while grew:
        grew = False
        for pid, (parent, _) in found.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: found[pid][1] for pid in tree if pid in found}


def build(tree: str, source: Path, workers: int, out: Path) -> dict:
    """One whole build in a fresh process: wall, CPU, and the driver's time alone after the pool's first work."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    argv = [sys.executable, "-c", "from beam_jobs.cli import console; console()", "build", "--input", str(source),
            "--output", str(out), "--overwrite", "--no-progress", "--workers", str(workers), "--validate",
            "structure"]
    before, start = os.times(), time.perf_counter()
    child = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: dict[int, int] = {}
    alone, pool_started, last = 0.0, False, start
    while child.poll() is None:
        time.sleep(0.05)
        now_ticks, now = ticks(child.pid), time.perf_counter()
        spent = {pid: t - seen.get(pid, 0) for pid, t in now_ticks.items()}
        workers_spent = sum(t for pid, t in spent.items() if pid != child.pid)
        if workers_spent:
            pool_started = True
        elif pool_started and spent.get(child.pid, 0):
            alone += now - last
        seen, last = now_ticks, now
    printed = child.stdout.read().decode()
    wall, after = time.perf_counter() - start, os.times()
    if child.returncode:
        raise SystemExit(f"bench_pass_workers: a build of {tree} failed:\n{printed[-2000:]}")
    cpu = after.children_user + after.children_system - before.children_user - before.children_system
    return {"wall": round(wall, 3), "cpu": round(cpu, 3), "alone": round(alone, 2)}


def median_of(runs: list[dict], tree: str, workers: int, size: str) -> dict[str, float]:
    """The medians of one tree's builds of one size on one worker count."""
    mine = [x for x in runs if (x["tree"], x["workers"], x["size"]) == (tree, workers, size)]
    return {key: statistics.median(x[key] for x in mine) for key in ("wall", "cpu", "alone")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--workers", default="2,8,16", help="worker counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--against", required=True, help="another checkout of the project, built side by side")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-pass-workers"))
    ap.add_argument("--json", default="", help="write every build's figures here too")
    args = ap.parse_args(argv)
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers must be whole numbers, comma-separated, not {args.workers!r}")
    if args.count <= TINY or args.rounds < 1 or min(workers) < 1 or not Path(args.against, "beam_jobs").is_dir():
        ap.error(f"--count must be above {TINY}, --rounds and every worker count at least 1, and --against a "
                 "checkout of the project")
    trees = {"this tree": str(HERE.parent), "--against": str(Path(args.against).resolve())}
    root = Path(args.work)
    data = make_images(root, args.count)
    sources = {"small": tiny_copy(data, root), "large": data}
    for tree in trees.values():  # untimed: byte-compiles each tree and reads the images once
        build(tree, data, 2, root / "out")
    runs: list[dict] = []
    for r in range(args.rounds):
        for w in workers:
            order = list(trees.items()) if (r + w) % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                for size, source in sources.items():
                    runs.append({"tree": name, "workers": w, "size": size, **build(tree, source, w, root / "out")})
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    print(f"pass-through builds of {TINY} and {args.count} images, medians of {args.rounds} alternating rounds; "
          f"{os.cpu_count()} CPUs")
    between = args.count - TINY
    for w in workers:
        for name in trees:
            small, large = (median_of(runs, name, w, "small"), median_of(runs, name, w, "large"))
            steady = (large["wall"] - small["wall"]) / between * 1000
            cpu = (large["cpu"] - small["cpu"]) / between * 1000
            print(f"{w:3d} workers, {name:10}: wall {small['wall']:.2f} s / {large['wall']:.2f} s, "
                  f"steady {steady:.4f} ms of wall and {cpu:.3f} ms of CPU an image, the driver alone "
                  f"{large['alone']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
