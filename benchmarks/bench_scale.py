"""The path that runs at scale, measured here: a bucket-to-bucket build through a latency and fault proxy.

    python benchmarks/bench_scale.py [--images 800] [--latency-ms 20] [--fault-rate 0.1] [--work DIR]

gcp-storage-emulator on loopback stands in for Cloud Storage; a proxy in front of it (tests/gcs_fixtures.py)
counts every request, adds a fixed latency to each one, or fails a seeded share of them with 503/429/reset.
The build is the job's own graph, the one Dataflow runs, scaled down: 16 shards of about 1 MB, runs written
in parts of 1/8 of a shard (as 128 MB shards are of 16 MB parts). Runs, in one process each:

  base       no latency: requests per record by kind, bytes of runs read back per shard byte, time T0
  latency    every request --latency-ms later: time T1; the cost of latency is (T1 - T0) against the serial
             cost (requests x latency), which is what a build that made its requests in turn would pay
  faults     --fault-rate of requests failing: the build completes with byte-identical shards
  processes  Beam's in-process runner in multi_processing mode, 2 SDK processes (Dataflow's shape: several
             processes, no state shared): byte-identical shards

Targets (issue 26): at most 1.05 GETs per source object; runs read back at most 0.25x the shard bytes;
20 ms of latency adds at most 0.25x the serial cost. The build's fixed steps (lock, listing levels, planning,
publishing: a few dozen requests in turn) do not grow with the dataset; the encode phase, which does, is
reported on its own too. Class A/B counts feed the cost note in docs/dataflow.md.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from gcs_fixtures import FaultProxy, running_emulator  # noqa: E402

SHARDS = 16
LABELS = 10


def make_images(folder: Path, count: int) -> None:
    """`count` photo-like JPEGs (320x240, ~25 KB) in LABELS label folders, made once."""
    if folder.exists() and sum(1 for _ in folder.rglob("*.jpg")) == count:
        return
    import numpy as np
    from PIL import Image

    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        label = folder / f"class{i % LABELS:02d}"
        label.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((320, 240), Image.BICUBIC)
        image.save(label / f"photo{i:06d}.jpg", quality=90)


def kind_of(method: str, path: str) -> str:
    """What a JSON-API request does (GCS's operation classes: A = writes and lists, B = reads)."""
    url = urllib.parse.urlsplit(path)
    p = urllib.parse.unquote(url.path)
    query = urllib.parse.parse_qs(url.query)
    if method == "DELETE" or p.startswith("/batch"):
        return "delete (free)"
    if "/compose" in p:
        return "compose (A)"
    if "/rewriteTo/" in p or "/copyTo/" in p:
        return "rewrite (A)"
    if method in ("POST", "PUT") and ("/upload/" in p or method == "PUT"):
        return "upload (A)"
    if method == "PATCH":
        return "patch (A)"
    if method == "GET" and re.fullmatch(r"(/download)?/storage/v1/b/[^/]+/o", p):
        return "list (A)"
    if method == "GET" and query.get("alt") == ["media"]:
        return "read (B)"
    if method == "GET":
        return "metadata (B)"
    return f"{method} other"


def build(args: list[str], env: dict, out: str) -> float:
    """Run the build in its own process; its wall time."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "beam_jobs.cli", "build", *args, "--output", out, "--overwrite"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"build failed: {done.stderr.strip()[-2000:]}")
    return time.monotonic() - started


def shards_of(em, uri: str) -> dict[str, bytes]:
    bucket, prefix = uri[len("gs://"):].split("/", 1)
    return {n: b for n, b in em.objects(bucket, prefix + "/").items() if n.endswith(".tfrecord")}


def encode_span(timeline: list) -> tuple[float, int]:
    """(seconds from the first to the last read of a source image, how many such reads): the encode phase."""
    reads = [(start, end) for start, end, method, path in timeline
             if kind_of(method, path) == "read (B)" and "/photos/" in urllib.parse.unquote(path)]
    return (max(e for _, e in reads) - min(s for s, _ in reads), len(reads)) if reads else (0.0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=800)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--fault-rate", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2, help="local encode processes (default 2)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "tpu-shards-bench-scale"))
    args = ap.parse_args()
    work = Path(args.work)
    make_images(work / "images", args.images)
    with running_emulator(work) as em:
        raw, out = em.new_bucket("raw"), em.new_bucket("out")
        uploaded = em.upload_tree(work / "images", raw, "photos")
        shard_mb = sum(p.stat().st_size for p in (work / "images").rglob("*.jpg")) / SHARDS / 1e6
        common = ["--input", f"gs://{raw}/photos", "--num-shards", str(SHARDS), "--num-cores", "8",
                  "--run-part-mb", f"{shard_mb / 8:.4f}", "--no-progress"]
        local = [*common, "--workers", str(args.workers)]
        results = {}
        for name, proxy_kw, extra in (("base", {}, local),
                                      ("latency", {"latency": args.latency_ms / 1000}, local),
                                      ("faults", {"rate": args.fault_rate, "seed": 7}, local),
                                      ("processes", {}, [*common, "--direct_num_workers=2",
                                                         "--direct_running_mode=multi_processing"])):
            with FaultProxy(em.url, **proxy_kw) as proxy:
                env = {**os.environ, "STORAGE_EMULATOR_HOST": proxy.url, "TF_CPP_MIN_LOG_LEVEL": "2"}
                target = f"gs://{out}/{name}"
                seconds = build(extra, env, target)
            results[name] = (seconds, list(proxy.requests), list(proxy.served), proxy.faults, shards_of(em, target),
                             encode_span(proxy.timeline))
            print(f"{name:<10} {seconds:6.1f} s  {len(proxy.requests)} requests  {proxy.faults} failed on purpose",
                  flush=True)
    report(results, uploaded, args)


def report(results: dict, records: int, args) -> None:
    seconds, requests, served, _, shards, _ = results["base"]
    shard_bytes = sum(map(len, shards.values()))
    kinds = collections.Counter(kind_of(m, p) for m, p in requests)
    source_reads = sum(1 for m, p, _ in served if kind_of(m, p) == "read (B)" and "/photos/" in urllib.parse.unquote(p))
    read_back = sum(n for m, p, n in served
                    if kind_of(m, p) == "read (B)" and "/runs/" in urllib.parse.unquote(p)
                    and ".records" in urllib.parse.unquote(p))
    print(f"\nbucket to bucket, {records} images, {len(shards)} shards of {shard_bytes / len(shards) / 1e6:.2f} MB "
          f"({shard_bytes / 1e6:.1f} MB in all), {args.workers} encode processes")
    print("requests by kind: in all, per record, per shard")
    for kind, n in sorted(kinds.items()):
        print(f"    {kind:<16} {n:6d}   {n / records:6.3f}   {n / len(shards):6.2f}")
    class_a = sum(n for k, n in kinds.items() if "(A)" in k)
    class_b = sum(n for k, n in kinds.items() if "(B)" in k)
    print(f"    class A {class_a / records:.3f}, class B {class_b / records:.3f} per record")
    print(f"GETs per source object: {source_reads / records:.3f} (target <= 1.05)")
    print(f"runs read back: {read_back / shard_bytes:.3f} x the shard bytes (target <= 0.25)")
    latency = args.latency_ms / 1000
    t1, requests1 = results["latency"][0], results["latency"][1]
    serial = len(requests1) * latency
    print(f"latency {args.latency_ms:g} ms: {seconds:.1f} s -> {t1:.1f} s; added {t1 - seconds:.1f} s against a "
          f"serial cost of {serial:.1f} s ({len(requests1)} requests x {args.latency_ms:g} ms): "
          f"{(t1 - seconds) / serial:.2f}x (target <= 0.25)")
    (span0, _), (span1, reads1) = results["base"][5], results["latency"][5]
    print(f"  of which the encode phase (first to last source read): {span0:.1f} s -> {span1:.1f} s; added "
          f"{span1 - span0:.1f} s against {reads1} reads x {args.latency_ms:g} ms = {reads1 * latency:.1f} s: "
          f"{(span1 - span0) / (reads1 * latency):.2f}x")
    for name in ("faults", "processes"):
        same = results[name][4] == shards
        print(f"{name}: shards {'byte-identical' if same else 'DIFFER'} to the base run"
              + (f" ({results[name][3]} requests failed on purpose)" if name == "faults" else ""))


if __name__ == "__main__":
    main()
