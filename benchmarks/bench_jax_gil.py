"""make_iterator's Pillow path per record: the CPU that holds the GIL beside the CPU that lets go of it, on this tree
and on another commit's (default `main`, exported with `git archive`), side by side.

Pillow lets go of the GIL while it decodes a JPEG and while it resizes; everything else a record costs holds it:
the read, the Example parse, Image.open and draft, the pixels' copy out of Pillow, the label, and the main thread's
batch assembly. However many decode threads a host runs, one process yields at most 1e6 / (GIL-held us per record)
records a second: that ceiling is printed for each tree.

Each tree runs in its own process (its own `shard_utils` on the path), rounds alternating between the trees, one
decode thread (threads=1) so that what is measured is CPU time, not contention. Pillow's decoder and resize are
timed from inside (the thread's CPU time in each call); the GIL-held time is the process's CPU time less theirs,
an upper bound (a copy NumPy or Pillow makes without the GIL, and the kernel's page faults, count as held). "read"
(the source's reads of the same records, timed alone) and "main" (the main thread) are parts of it. The local
batches are taken from the iterator before the devices (no jax.Array is made).

    python benchmarks/bench_jax_gil.py --data /tmp/bench_jax_gil              # against main
    python benchmarks/bench_jax_gil.py --data /tmp/bench_jax_gil --against HEAD~3 --format tfrecord
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("array_record", "tfrecord")  # which shards make_iterator reads (the dataset has both)
PARTS = ("held", "read", "main", "other", "decode", "resize", "whole")


def instrument() -> dict[str, float]:
    """Time Pillow's JPEG decoder and resize from inside, in the calling thread's CPU seconds (accumulated)."""
    from PIL import Image

    spent = {"decode": 0.0, "resize": 0.0}
    get_decoder, resize = Image._getdecoder, Image.Image.resize

    class Timed:
        def __init__(self, decoder):
            self._decoder = decoder

        def decode(self, data):
            began = time.thread_time()
            try:
                return self._decoder.decode(data)
            finally:
                spent["decode"] += time.thread_time() - began

        def __getattr__(self, name):
            return getattr(self._decoder, name)

    def timed_resize(self, *args, **kwargs):
        self.load()  # the decode, timed by its decoder, outside the resize's clock
        began = time.thread_time()
        try:
            return resize(self, *args, **kwargs)
        finally:
            spent["resize"] += time.thread_time() - began

    Image._getdecoder = lambda *args, **kwargs: Timed(get_decoder(*args, **kwargs))
    Image.Image.resize = timed_resize
    return spent


def measure(dataset: str, fmt: str, size: int, batch: int, batches: int) -> dict[str, float]:
    """us per record of each part, in this process (whose path holds the tree measured)."""
    from shard_utils.format.manifest import load
    from shard_utils.jax_loader import make_iterator

    m = load(dataset)
    if fmt == "tfrecord":  # the same dataset seen without its ArrayRecord twins
        m = dataclasses.replace(m, splits={k: dataclasses.replace(v, array_record_shards=None)
                                           for k, v in m.splits.items()})
    it = make_iterator(m, "train", batch, seed=0, image_size=size, threads=1)
    spent = instrument()
    local = it._open(0)  # this process's numpy batches, as __next__ takes them
    for _ in range(2):
        next(local)
    before, threads = dict(spent), thread_cpu()
    cpu, main = time.process_time(), time.thread_time()
    for _ in range(batches):
        next(local)
    cpu, main = time.process_time() - cpu, time.thread_time() - main
    threads = {name: seconds - threads.get(name, 0.0) for name, seconds in thread_cpu().items()}
    local.close()
    records = batches * batch
    source = it._source
    rows = [it._plan.record(e) for e in range(records)]  # the iterator's own order: random, as training reads
    read = time.thread_time()
    for row in rows:
        source[row]
    read = time.thread_time() - read
    out = {part: (spent[part] - before[part]) / records * 1e6 for part in ("decode", "resize")}
    out["whole"] = cpu / records * 1e6
    out["held"] = out["whole"] - out["decode"] - out["resize"]
    out["main"] = main / records * 1e6
    out["read"] = read / len(rows) * 1e6
    out["other"] = sum(v for k, v in threads.items() if not k.startswith(("jax_loader", "MainThread"))) / records * 1e6
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each live thread of this process, by name (from /proc: clock ticks)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        name = names.get(int(task), f"native-{task}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def export(ref: str, into: Path) -> Path:
    """The tree of commit `ref`, from `git archive`."""
    tree = into / "tree"
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True, timeout=120)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    return tree


def run_one(tree: Path, args, dataset: Path) -> dict[str, float]:
    """One measurement in a fresh process whose `shard_utils` is `tree`'s."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__, "--one", str(dataset), "--format", args.format,
                           "--resize", str(args.resize), "--batch", str(args.batch), "--batches", str(args.batches)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tree)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        raise SystemExit(f"the measurement in {tree} failed: {done.stderr[-3000:]}")
    return json.loads(line[0][len("RESULT "):])


def report(results: dict[str, list[dict[str, float]]], header: str) -> list[str]:
    """Median us per record of each part per tree, the ceiling it sets, and each part's ratio (this / other)."""
    lines = [header, f"{'tree':24} {'GIL-held':>9} {'(read':>7} {'main)':>7} {'decode':>8} {'resize':>8} {'whole':>8}"
                     f"   us CPU per record; ceiling 1e6/held"]
    for name, runs in results.items():
        med = {part: statistics.median(r[part] for r in runs) for part in PARTS}
        rounds = " ".join(f"{r['held']:.0f}" for r in runs)
        ceiling = f"{1e6 / med['held']:,.0f}" if med["held"] > 0 else "-"  # a difference: noise can take it below 0
        lines.append(f"{name:24} {med['held']:9.0f} {med['read']:7.0f} {med['main']:7.0f} {med['decode']:8.0f} "
                     f"{med['resize']:8.0f} {med['whole']:8.0f}   {ceiling} records/s; held per round {rounds}")
    this, other = results.values()
    for part in ("held", "read", "main", "whole"):
        ratio = statistics.median(a[part] / b[part] for a, b in zip(this, other, strict=True))
        lines.append(f"{part}: {ratio:.2f}x the other tree's (median of each round's ratio)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for generated images and shards (default: a temp dir)")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--source-size", type=int, default=400, help="side of the generated JPEGs (default 400)")
    ap.add_argument("--resize", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=12, help="timed batches per measurement (default 12)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--format", choices=FORMATS, default=FORMATS[0], help="the shards read (default array_record)")
    ap.add_argument("--against", default="main", help="the commit to compare this tree with (default main)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure the dataset at this path, in this process
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(measure(args.one, args.format, args.resize, args.batch, args.batches)))
        return 0
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_jax_gil_"))
    data.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]
    from bench_loader import build

    dataset = build(data, args.images, args.source_size, "both")
    trees = {"this tree": REPO, args.against: export(args.against, Path(tempfile.mkdtemp(prefix="bench_jax_gil_")))}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    names = list(trees)
    for round_ in range(args.rounds):
        for name in names[round_ % 2:] + names[:round_ % 2]:
            results[name].append(run_one(trees[name], args, dataset))
            print(f"round {round_ + 1}, {name}: {json.dumps({k: round(v) for k, v in results[name][-1].items()})}",
                  file=sys.stderr, flush=True)
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    header = (f"\n{args.images} {args.source_size}x{args.source_size} JPEGs -> {args.resize}x{args.resize}, "
              f"{args.format} shards, batch {args.batch}, {args.batches} batches, threads=1; medians of {args.rounds} "
              f"alternating rounds; {os.cpu_count()} CPUs, load average {load}")
    print("\n".join(report(results, header)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
