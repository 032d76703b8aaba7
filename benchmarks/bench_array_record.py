"""ArrayRecord output: Grain random-access reads against the TFRecord + index source, and what --format both costs.

On one dataset the real job builds with --format both (the same records in both formats):
  (a) records/s of a shuffled Grain pipeline (MapDataset.source, seed, shuffle, repeat, 4 reader threads), decode
      off (serialized records) and on (the project's Pillow Decoder), from `grain.sources.ArrayRecordDataSource`
      over the split's ArrayRecord shards and from `RandomAccessSource` (TFRecord shards + Avro index);
  (b) wall time of `tpu-shards build --format both` against `--format tfrecord` on the same images, in
      alternating rounds (each a fresh process and output folder).
Both sides of each comparison run in turn in one process run, on the same machine; the ratios are the result.

    python benchmarks/bench_array_record.py                      # 2048 images of 320x240 in a temp dir
    python benchmarks/bench_array_record.py --data /tmp/bench_ar --rounds 3
"""
from __future__ import annotations

import argparse
import os
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


def make_images(data: Path, count: int, width: int, height: int) -> Path:
    """`count` photo-like JPEGs under LABELS (once per data folder)."""
    images = data / f"images-{count}-{width}x{height}"
    if not images.exists():
        per = {label: count // len(LABELS) + (i < count % len(LABELS)) for i, label in enumerate(LABELS)}
        write_images(images, per, size=(width, height))
    return images


def build(images: Path, out: Path, fmt: str, image_size: int, workers: int) -> float:
    """Seconds of one `tpu-shards build` in a fresh process into an empty folder."""
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "beam_jobs.cli", "build", "--input", str(images), "--output", str(out),
                           "--image-size", str(image_size), "--format", fmt, "--workers", str(workers),
                           "--no-progress"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"build --format {fmt} failed: {done.stderr[-2000:]}")
    return seconds


def records_per_second(source, decode, threads: int, records: int, warmup: int) -> float:
    """Records/s of a shuffled Grain pipeline over `source` (`decode`: a map function or None)."""
    import grain

    ds = grain.MapDataset.source(source).seed(0).shuffle().repeat()
    if decode is not None:
        ds = ds.map(decode)
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 * threads)))
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(records):
        next(it)
    return records / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for generated images and datasets (default: a temp dir)")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--source-size", default="320x240", help="WxH of the generated JPEGs")
    ap.add_argument("--image-size", type=int, default=160)
    ap.add_argument("--threads", type=int, default=4, help="Grain reader threads")
    ap.add_argument("--records", type=int, default=4000, help="timed records per read measurement (decode on: / 4)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each measurement")
    ap.add_argument("--workers", type=int, default=2, help="encode processes per build")
    ap.add_argument("--skip-build-time", action="store_true", help="measure reads only")
    args = ap.parse_args(argv)
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_array_record_"))
    data.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.source_size.split("x"))
    images = make_images(data, args.images, width, height)
    dataset = data / "both"
    if not (dataset / "manifest.json").exists():
        build(images, dataset, "both", args.image_size, args.workers)

    import grain

    from shard_utils.format.manifest import load
    from shard_utils.read.random_access import Decoder, RandomAccessSource

    m = load(str(dataset))
    split = "train"
    sources = {"ArrayRecordDataSource": grain.sources.ArrayRecordDataSource(m.array_record_paths(split)),
               "RandomAccessSource (TFRecord + index)": RandomAccessSource(m, split)}
    decoder = Decoder.for_manifest(m)
    print(f"\n{m.num_records(split)} records in {len(m.split(split).shards)} shards per format "
          f"({m.split(split).num_bytes / 1e6:.1f} MB TFRecord), {args.image_size}x{args.image_size} JPEG; "
          f"{os.cpu_count()} CPUs; Grain {args.threads} threads, shuffled; best of {args.rounds} alternating rounds")
    print(f"{'records/s':44} {'decode off':>11} {'decode on':>10}")
    best: dict[tuple[str, bool], float] = {}
    for _ in range(args.rounds):
        for decode in (False, True):
            for name, source in sources.items():
                n = args.records // 4 if decode else args.records
                rate = records_per_second(source, decoder if decode else None, args.threads, n, 4 * args.threads)
                best[(name, decode)] = max(best.get((name, decode), 0.0), rate)
    for name in sources:
        print(f"{name:44} {best[(name, False)]:11.0f} {best[(name, True)]:10.0f}")
    ar, tf = sources
    print(f"{'ratio ArrayRecord / TFRecord + index':44} {best[(ar, False)] / best[(tf, False)]:10.2f}x "
          f"{best[(ar, True)] / best[(tf, True)]:9.2f}x")
    if args.skip_build_time:
        return
    times: dict[str, list[float]] = {"tfrecord": [], "both": []}
    for _ in range(args.rounds):
        for fmt in times:
            times[fmt].append(build(images, data / f"timed-{fmt}", fmt, args.image_size, args.workers))
    print(f"\nbuild of {args.images} images ({args.source_size} -> {args.image_size}), {args.workers} workers, "
          f"{args.rounds} alternating rounds: median seconds")
    for fmt, seconds in times.items():
        print(f"  --format {fmt:10} {statistics.median(seconds):7.2f}  ({', '.join(f'{s:.2f}' for s in seconds)})")
    print(f"  ratio both / tfrecord {statistics.median(times['both']) / statistics.median(times['tfrecord']):.3f}x")


if __name__ == "__main__":
    sys.exit(main())
