"""A listing-driven build against a folder build of the same images: images/s side by side in one run.

    python benchmarks/bench_listing_build.py [--count 4000] [--rounds 3] [--work /tmp/tpu-shards-bench]

Writes `count` photo-like ~400x400 JPEGs in 10 label folders and a CSV listing (path,label) of the same
files, then builds them both ways, alternating, each in a fresh process (Beam imported before the clock
starts), on all cores with pass-through (`--validate decode`). Prints images/s per round and the median
ratio listing / folder. The listing path adds a Beam source, a row-to-item step and a de-duplication
shuffle of the rows; the issue's target is within 10 % of the folder build per image.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

CHILD = textwrap.dedent("""
    import json, sys, time
    import apache_beam  # imported before the clock starts, as for every job figure
    from beam_jobs.build_shards import run
    start = time.perf_counter()
    m = run(sys.argv[2:])
    records = sum(s.num_records for s in m.splits.values())
    print(json.dumps({"seconds": time.perf_counter() - start, "records": records}))
""")


def build(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, "-", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/tpu-shards-bench")
    args = ap.parse_args()
    from build_bench.data import input_folder  # the same photo-like images as the build benchmark

    work = Path(args.work)
    images = input_folder(work, "jpg", args.count, os.cpu_count() or 1)
    listing = work / f"listing-{args.count}.csv"
    files = sorted(p.relative_to(images).as_posix() for p in images.rglob("*.jpg"))
    listing.write_text("path,label\n" + "".join(f"{f},{f.split('/')[0]}\n" for f in files))
    rates: dict[str, list[float]] = {"folder": [], "listing": []}
    for _ in range(args.rounds):
        for kind in ("folder", "listing"):
            out = work / f"out-{kind}"
            shutil.rmtree(out, ignore_errors=True)
            extra = ["--listing", str(listing)] if kind == "listing" else []
            r = build(["--input", str(images), "--output", str(out), *extra])
            assert r["records"] == args.count, r
            rates[kind].append(args.count / r["seconds"])
    print(f"{args.count} JPEGs (~400x400), pass-through, all {os.cpu_count()} cores; images/s per round "
          "(time inside the process, Beam imported first)")
    for kind, values in rates.items():
        print(f"  {kind:8} median {statistics.median(values):7.1f}   " + " ".join(f"{v:7.1f}" for v in values))
    ratio = statistics.median(listing / folder
                              for listing, folder in zip(rates["listing"], rates["folder"], strict=True))
    print(f"  listing / folder, median of paired rounds: {ratio:.2f}x (target: within 10 %, >= 0.90x)")


if __name__ == "__main__":
    main()
