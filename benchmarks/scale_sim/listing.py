"""ListMedia's own listing over 10^6-10^7 synthetic object names, against a stand-in that pages like Cloud Storage.

    python -m benchmarks.scale_sim.listing [--objects 1000000,10000000] [--layouts flat_numbered,...]

For each layout the bucket's names are made in memory (sorted), and `list_task` (beam_jobs/pipeline/listing.py)
runs stage by stage as the graph runs it: every task of a stage lists on its own, through shard_utils' gs://
code, whose client is the stand-in (benchmarks/scale_sim/stand_in.py: pages of 1,000 entries, items and
prefixes together, offsets on object names). Printed per layout: objects there and listed (each exactly
once), pages listed, the critical path (the longest chain of pages listed one after another, through the
stages) in pages and as a share of all pages, tasks per stage, and the serial requests of the driver's
preflight (`check_input`). Targets (issue 36): every object once; critical path at most 2 % of the pages.
"""
from __future__ import annotations

import argparse
import bisect
import gc
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.scale_sim.stand_in import Client  # noqa: E402

ROOT = "gs://sim"


def _hex_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return sorted(rng.getrandbits(128) for _ in range(n))


def flat_numbered(n: int) -> Iterator[str]:
    return (f"IMG_{i:08d}.jpg" for i in range(n))


def flat_hex(n: int) -> Iterator[str]:
    return (f"{x:032x}.jpg" for x in _hex_ids(n, 1))


def folder_per_sample(n: int) -> Iterator[str]:
    return (f"{x:032x}/img.jpg" for x in _hex_ids(n, 2))


def label_folders(n: int, labels: int = 1000) -> Iterator[str]:
    ids = sorted(random.Random(3).sample(range(10 ** 8), labels))
    return (f"n{label:08d}/{i:07d}.jpg" for k, label in enumerate(ids)
            for i in range(n * (k + 1) // labels - n * k // labels))


def date_folders(n: int) -> Iterator[str]:
    hours = [f"{y}/{m:02d}/{d:02d}/{h:02d}" for y in range(2015, 2025) for m in range(1, 13) for d in range(1, 29)
             for h in range(24)]
    return (f"{hour}/{i:06d}.jpg" for k, hour in enumerate(hours)
            for i in range(n * (k + 1) // len(hours) - n * k // len(hours)))


def two_level_hex(n: int) -> Iterator[str]:
    return (f"{x >> 120:02x}/{(x >> 112) & 255:02x}/{x:032x}.jpg" for x in _hex_ids(n, 4))


LAYOUTS: dict[str, Callable[[int], Iterator[str]]] = {
    "flat_numbered": flat_numbered, "flat_hex": flat_hex, "folder_per_sample": folder_per_sample,
    "label_folders": label_folders, "date_folders": date_folders, "two_level_hex": two_level_hex}


def simulate(names: list[str]) -> dict:
    """Run the listing's stages over the names with the stand-in as the storage client; what it did."""
    import apache_beam as beam

    from beam_jobs.jobs.checks import check_input
    from beam_jobs.pipeline import listing
    from beam_jobs.run.config import BuildConfig
    from shard_utils.storage import base

    client = Client(names)
    base._client = (os.environ.get("STORAGE_EMULATOR_HOST") or None, client)  # the stand-in answers gs:// calls
    try:
        check_input(ROOT)
        preflight = client.requests
        config = BuildConfig(input=ROOT, output="gs://out/ds", temp_root="gs://out/tmp")
        seen = bytearray(len(names))
        twice = listed = 0
        tasks: list[tuple[listing.ListTask, int]] = [(listing.ListTask(""), 0)]  # (task, pages before it)
        per_stage, critical, pages = [], 0, 0
        for stage in range(1, listing.STAGES + 1):
            per_stage.append(len(tasks))
            following = []
            for task, before in tasks:
                start = client.requests
                out = list(listing.list_task(task, config, stage == listing.STAGES))
                chain = before + client.requests - start
                critical = max(critical, chain)
                for found in out:
                    if isinstance(found, beam.pvalue.TaggedOutput):
                        following.append((found.value, chain))
                        continue
                    for entry in found:
                        i = bisect.bisect_left(names, entry.rel_path)
                        twice += seen[i]
                        seen[i] = 1
                        listed += 1
            tasks = following
        pages = client.requests - preflight
    finally:
        base._client = None
    return {"objects": len(names), "listed": listed, "once": twice == 0 and listed == len(names), "pages": pages,
            "critical": critical, "stages": per_stage, "preflight": preflight, "left": len(tasks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", default="1000000")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    args = ap.parse_args()
    print(f"{'layout':18s} {'objects':>10s} {'listed':>10s} once {'pages':>7s} {'critical':>8s} {'%':>6s}  "
          f"preflight  tasks per stage", flush=True)
    for n in (int(x) for x in args.objects.split(",")):
        for name in args.layouts.split(","):
            names = list(LAYOUTS[name](n))
            started = time.process_time()
            r = simulate(names)
            del names
            gc.collect()
            share = 100 * r["critical"] / max(1, r["pages"])
            print(f"{name:18s} {r['objects']:>10,d} {r['listed']:>10,d} {'yes' if r['once'] else 'NO':4s} "
                  f"{r['pages']:>7,d} {r['critical']:>8,d} {share:5.2f}%  {r['preflight']:>9d}  "
                  f"{' / '.join(f'{t:,d}' for t in r['stages'])}  ({time.process_time() - started:.0f} s CPU, "
                  f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)", flush=True)
            assert r["left"] == 0


if __name__ == "__main__":
    main()
