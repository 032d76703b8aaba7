"""The rejected-files report over 10^5-10^7 simulated rejects: the publish code's peak memory stays flat.

    python -m benchmarks.scale_sim.reports [--rejects 100000,1000000] [--held]

Each count runs in a child process of its own (so its peak RSS is its own). The rejects come from a
generator, never a list, and go through what the job runs: `ReportCounts` per bundle of 10,000, merged (the
combine), the piece bounds, each piece written sorted (`write_piece`: the entries of one piece at a time, as
GroupByKey hands them to a worker; the generator yields sources in order, so a piece's entries are
contiguous), then `plan_publication` with --max-rejected 0: its failure line from the counts, and the report
composed from the pieces. Printed per count: pieces, report bytes, lines (checked sorted, streamed), the peak
RSS and the time. `--held` holds every reject in a list first, as the one-key join did before, for comparison.
"""
from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from beam_jobs import publish  # noqa: E402
from beam_jobs.run.config import BuildConfig, RejectLimit  # noqa: E402
from beam_jobs.run.identity import RunInfo  # noqa: E402
from beam_jobs.run.reports import Report, ReportCounts, piece_of, write_piece  # noqa: E402
from beam_jobs.run.tally import Tally  # noqa: E402
from shard_utils.errors import PlanError  # noqa: E402

REASONS = ("corrupt", "too_small", "unreadable", "no_label", "symlink")
BUNDLE = 10_000  # entries counted per accumulator before merging, as a runner's bundles would


def rejects(n: int) -> Iterator[dict]:
    """n reject dicts in source order, with reasons spread unevenly (as a real build's are)."""
    for i in range(n):
        reason = REASONS[(i * 2654435761 >> 7) % 7 % len(REASONS)]
        yield {"source": f"gs://sim/photos/{i // 1000:05d}/IMG_{i:09d}.jpg", "reason": reason,
               "message": f"cannot identify image file (simulated {reason})"}


def counted_in_bundles(n: int) -> ReportCounts:
    total = ReportCounts()
    stream = rejects(n)
    while bundle := list(itertools.islice(stream, BUNDLE)):
        part = ReportCounts()
        for entry in bundle:
            part.add(entry)
        total.merge(part)
    return total


def simulate(n: int, folder: str, held: bool = False) -> dict:
    """The report of n rejects planned and written under folder; what it took."""
    start = time.perf_counter()
    config = BuildConfig(input=f"{folder}/in", output=f"{folder}/out", temp_root=f"{folder}/tmp", num_cores=1,
                         run_id="sim", created="2026-01-01T00:00:00+00:00", max_rejected=RejectLimit(count=0))
    run = RunInfo("sim", config.temp_dir("sim"), config.created)
    if held:
        report: Report | list[dict] = list(rejects(n))
        pieces = 1
    else:
        counts = counted_in_bundles(n)
        bounds = counts.bounds()
        paths = tuple(write_piece(run.temp_dir, "rejected", piece, group)
                      for piece, group in itertools.groupby(rejects(n), key=lambda e: piece_of(e, bounds)))
        report, pieces = Report(counts.brief(), paths), len(paths)
    try:
        publish.plan_publication([], config, plans=[{}], failure=[], rejected=report, skipped_files=[],
                                 tally=Tally(seen=n), labels=[], run=run)
        raise AssertionError("more rejects than --max-rejected 0 allows, yet planned")
    except PlanError as exc:
        message = str(exc)
    written = Path(run.temp_dir) / "report" / "rejected.jsonl"
    lines, previous = 0, None
    with open(written, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            key = (entry["source"], entry["reason"], line)
            if previous is not None and key < previous:
                raise AssertionError(f"line {lines + 1} of {written} is out of order")
            lines, previous = lines + 1, key
    return {"rejects": n, "pieces": pieces, "report_bytes": written.stat().st_size, "lines": lines,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "seconds": round(time.perf_counter() - start, 1), "message": message[:160]}


def in_child(n: int, held: bool = False) -> dict:
    """simulate(n) in a fresh Python process (its peak RSS its own)."""
    args = [sys.executable, "-m", "benchmarks.scale_sim.reports", "--child", str(n)] + (["--held"] if held else [])
    done = subprocess.run(args, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent.parent)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rejects", default="100000,1000000", help="comma-separated counts")
    ap.add_argument("--held", action="store_true", help="hold every reject in a list first (the old one-key join)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(simulate(args.child, folder, args.held)))
        return
    print(f"{'rejects':>10} {'pieces':>6} {'report MB':>9} {'peak RSS MB':>11} {'s':>6}")
    for n in (int(x) for x in args.rejects.split(",")):
        r = in_child(n, args.held)
        assert r["lines"] == n, r
        print(f"{n:>10,} {r['pieces']:>6} {r['report_bytes'] / 1e6:>9.1f} {r['peak_rss_mb']:>11.1f} "
              f"{r['seconds']:>6.1f}")


if __name__ == "__main__":
    main()
