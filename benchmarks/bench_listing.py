"""Peak memory (RSS) of reading big listings through ReadListings, on Beam's in-process runner.

    python benchmarks/bench_listing.py [--rows 100000,1000000] [--formats csv,jsonl] [--work bench_listing_work]
    python benchmarks/bench_listing.py --control --rows 10000,100000   # the same with rows held in a list

Writes listings of paths only (no images; labels come from the file names), then for each one runs,
in a fresh process, ListingItems (ReadListings + the row-to-item step) into counting sinks, and prints
rows/s and the process's peak RSS, next to its RSS once Beam is imported. A reader that held the
listing in memory would grow ~10x from 100k to 1M rows; a streaming one stays flat. --control
gathers the items into one list before counting, to show the measurement sees such growth.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME_LABEL = r"^(?P<label>class\d+)_"


def write_listing(path: Path, rows: int, fmt: str) -> None:
    """`rows` rows naming c<k>/class<k>_<i>.jpg (paths only); CSV with a header, or JSONL."""
    with path.open("w") as f:
        if fmt == "csv":
            f.write("path\n")
            f.writelines(f"c{i % 10}/class{i % 10}_{i:07d}.jpg\n" for i in range(rows))
        else:
            f.writelines(f'{{"path": "c{i % 10}/class{i % 10}_{i:07d}.jpg"}}\n' for i in range(rows))


def child(listing: str, out: str, control: bool = False) -> None:
    """Run the read in this process and write {rows, rejected, seconds, rss_mb, base_rss_mb} to `out`."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from beam_jobs.pipeline.listing_sources import ListingItems, prepare_listings
    from shard_utils.inputs.listings import ListingOptions

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    options, _ = prepare_listings(ListingOptions(listings=(listing,), label_column=None, label_from_name=NAME_LABEL))
    counts = Path(out).with_suffix(".counts")
    counts.mkdir(exist_ok=True)
    start = time.perf_counter()
    with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([])) as p:
        listed = p | ListingItems(options, "/data")
        items = listed.items
        if control:  # every item in one list: what a reader holding the listing would cost
            items = items | beam.combiners.ToList() | beam.FlatMap(lambda xs: [1] * len(xs))
        for name, pcoll in (("rows", items), ("rejected", listed.rejected)):
            _ = (pcoll | f"Count{name}" >> beam.combiners.Count.Globally()
                 | f"Save{name}" >> beam.Map(lambda n, f=counts / name: f.write_text(str(n))))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {name: int((counts / name).read_text()) for name in ("rows", "rejected")}
    Path(out).write_text(json.dumps({**result, "seconds": seconds, "rss_mb": peak, "base_rss_mb": base}))


def measure(listing: Path, work: Path, control: bool) -> dict:
    out = work / (listing.name + ".json")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    subprocess.run([sys.executable, __file__, "--child", str(listing), str(out), *(["--control"] if control else [])],
                   check=True, env=env)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,1000000")
    ap.add_argument("--formats", default="csv,jsonl")
    ap.add_argument("--work", default="bench_listing_work")
    ap.add_argument("--control", action="store_true", help="hold every item in a list (shows memory growth)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, control=args.control)
        return
    work = Path(args.work)
    work.mkdir(exist_ok=True)
    sizes = [int(n) for n in args.rows.split(",")]
    for fmt in args.formats.split(","):
        peaks = []
        for rows in sizes:
            listing = work / f"listing-{rows}.{fmt}"
            if not listing.exists():
                write_listing(listing, rows, fmt)
            r = measure(listing, work, args.control)
            assert r["rows"] == rows and r["rejected"] == 0, r
            peaks.append(r["rss_mb"])
            print(f"{fmt:5s} {rows:>9,d} rows ({listing.stat().st_size / 1e6:5.1f} MB): {r['seconds']:6.1f} s, "
                  f"{rows / r['seconds']:8,.0f} rows/s, peak RSS {r['rss_mb']:6.0f} MB "
                  f"(after imports {r['base_rss_mb']:.0f} MB)", flush=True)
        print(f"{fmt:5s} peak RSS at {sizes[-1]:,} rows / at {sizes[0]:,} rows: {peaks[-1] / peaks[0]:.2f}x")


if __name__ == "__main__":
    main()
