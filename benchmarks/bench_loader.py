"""Loader throughput: make_dataset(training=True) against the Kaggle TPU docs' hand-written pipeline.

Both read the same shards in the same process and do the same work per image (decode the
JPEG, resize to --resize, scale to [0, 1], batch --batch). Rounds alternate between the
pipelines so a shared machine's load affects both alike; the median round is reported.
Raw record read speed (TFRecordDataset only, no parsing) is reported too.

    python benchmarks/bench_loader.py                      # 1024 images of 400x400 in a temp dir
    python benchmarks/bench_loader.py --data /tmp/bench    # keep and reuse the built shards
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

LABELS = ("alpha", "beta", "gamma", "delta")


def photo(size: int, seed: int) -> Image.Image:
    """A photo-like RGB image (gradients plus noise) that compresses like a real photo, distinct per seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([(x * (seed % 7 + 1) + y) % 256, (y * 2 + seed * 13) % 256, (x + y * 3 + seed * 29) % 256], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8), "RGB")


def write_photos(images: Path, count: int, make: Callable[[int], Image.Image]) -> Path:
    """`count` JPEGs `make(i)` in label folders under `images` (those already there kept); returns `images`."""
    for i in range(count):
        folder = images / LABELS[i % len(LABELS)]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:05d}.jpg"
        if not path.exists():
            make(i).save(path, "JPEG", quality=90)
    return images


def build(data: Path, count: int, size: int, fmt: str = "tfrecord") -> Path:
    """Write `count` JPEGs and shard them with the real job (`--format fmt`, once per data folder); returns the
    dataset folder."""
    out = data / (f"shards-{count}-{size}" + ("" if fmt == "tfrecord" else f"-{fmt}"))
    if (out / "manifest.json").exists():
        return out
    images = write_photos(data / f"images-{count}-{size}", count, lambda i: photo(size, i))
    from beam_jobs.jobs.build import run

    run(["--input", str(images), "--output", str(out), "--format", fmt])
    return out


def folklore(paths: list[str], size: int, batch: int):
    """The pipeline the Kaggle TPU docs teach, written by hand (feature spec included)."""
    import tensorflow as tf

    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def read_labeled_tfrecord(example):
        example = tf.io.parse_single_example(example, features)
        image = tf.image.decode_jpeg(example["image/encoded"], channels=3)
        image = tf.cast(tf.image.resize(image, [size, size]), tf.float32) / 255.0
        return image, tf.cast(example["image/class/label"], tf.int32)

    ignore_order = tf.data.Options()
    ignore_order.experimental_deterministic = False
    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE).with_options(ignore_order)
    ds = ds.map(read_labeled_tfrecord, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def throughput(ds, batch: int, batches: int, warmup: int) -> tuple[float, float]:
    """(images/s, CPU ms per image) over `batches` batches after `warmup` batches (fill, tracing) are discarded.

    CPU time counts every thread of this process, so it is steadier than wall time on a shared machine.
    """
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return batches * batch / wall, cpu * 1e3 / (batches * batch)


def raw_read(paths: list[str], num_bytes: int) -> tuple[float, float]:
    """(MB/s, records/s) of reading every record with TFRecordDataset(num_parallel_reads=AUTOTUNE)."""
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE).map(tf.strings.length)
    start = time.perf_counter()
    total = ds.reduce(np.int64(0), lambda acc, n: acc + tf.cast(n, tf.int64)).numpy()
    seconds = time.perf_counter() - start
    records = sum(1 for _ in ds)
    assert total <= num_bytes
    return num_bytes / 1e6 / seconds, records / seconds


def dataset_options(ap: argparse.ArgumentParser) -> None:
    """The options of a loader benchmark's dataset and batches: where, how many images, their size, the batch."""
    ap.add_argument("--data", help="folder for generated images and shards (default: a temp dir)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--source-size", type=int, default=400, help="side of the generated JPEGs (default 400)")
    ap.add_argument("--resize", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dataset_options(ap)
    ap.add_argument("--batches", type=int, default=32, help="timed batches per round (default 32)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_loader_"))
    data.mkdir(parents=True, exist_ok=True)
    dataset = build(data, args.images, args.source_size)

    import tensorflow as tf

    from shard_utils.read import loader

    m = loader.load_manifest(str(dataset))
    split = "train" if "train" in m.splits else sorted(m.splits)[0]
    paths, num_bytes = m.shard_paths(split), m.split(split).num_bytes
    candidates = {
        "folklore (Kaggle TPU docs)": lambda: folklore(paths, args.resize, args.batch),
        "make_dataset(training=True)": lambda: loader.make_dataset(m, split, args.batch, image_size=args.resize),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    reads = []
    for _ in range(args.rounds):
        reads.append(raw_read(paths, num_bytes))
        for name, make in candidates.items():
            results[name].append(throughput(make(), args.batch, args.batches, warmup=4))
    base = results["folklore (Kaggle TPU docs)"]
    print(f"\n{m.num_records(split)} records in {len(paths)} shards ({num_bytes / 1e6:.1f} MB), "
          f"{args.source_size}x{args.source_size} JPEG -> {args.resize}x{args.resize} float32, batch {args.batch}; "
          f"TF {tf.__version__}, {os.cpu_count()} CPUs; median of {args.rounds} alternating rounds")
    print(f"{'pipeline':30} {'images/s':>9} {'CPU ms/image':>13} {'vs folklore (paired)':>21}   images/s per round")
    for name, runs in results.items():
        speed = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        ratio = statistics.median(r[0] / b[0] for r, b in zip(runs, base, strict=True))
        rounds = " ".join(f"{r[0]:.0f}" for r in runs)
        print(f"{name:30} {speed:9.0f} {cpu:13.2f} {ratio:20.2f}x   {rounds}")
    mb = statistics.median(x[0] for x in reads)
    rec = statistics.median(x[1] for x in reads)
    print(f"{'raw record read':30} {rec:9.0f} records/s, {mb:.0f} MB/s (TFRecordDataset, num_parallel_reads=AUTOTUNE)")

if __name__ == "__main__":
    sys.exit(main())
