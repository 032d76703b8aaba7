"""Random access through the index: reads/s locally and on a storage emulator, and Grain against tf.data.

Measures, on shards the real job builds:
  * random reads/s of single records (`src[i]`, one ranged read each) and of batched reads
    (`src._getitems`, 64 random indices), locally and from gcp-storage-emulator on loopback (1 and 8 threads);
  * images/s of a sequential tf.data pipeline (TFRecordDataset, parse, decode_jpeg, batch) against a Grain
    pipeline in random order over the same shards (MapDataset.source, shuffle, Pillow decode, batch, threads).
The emulator is a single Python process: its figures show per-request overhead, not Cloud Storage speed.

    python benchmarks/bench_random_access.py                     # 1024 images of 400x400 in a temp dir
    python benchmarks/bench_random_access.py --data /tmp/bench   # keep and reuse the built shards
"""
from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]

from bench_loader import photo, write_photos  # noqa: E402


def build(data: Path, count: int, size: int, image_size: int) -> Path:
    """JPEGs sharded by the real job at a fixed image size, with an index (once per data folder)."""
    out = data / f"ra-{count}-{size}-{image_size}"
    if (out / "manifest.json").exists():
        return out
    images = write_photos(data / f"images-{count}-{size}", count, lambda i: photo(size, i))
    from beam_jobs.jobs.build import run

    run(["--input", str(images), "--output", str(out), "--image-size", str(image_size), "--resize", "fill"])
    from shard_utils.format import manifest

    if any(s.index is None for s in manifest.load(str(out)).splits.values()):
        from index_helpers import add_index  # TODO(lead): drop once the job writes the index itself

        add_index(out)
    return out


def reads_per_second(src, reads: int, threads: int = 1, batch: int = 0, seed: int = 0) -> tuple[float, float]:
    """(records/s, MB/s) of `reads` random records, one at a time or `batch` at a time, on `threads` threads."""
    rng = random.Random(seed)
    order = [rng.randrange(len(src)) for _ in range(reads)]
    if batch:
        calls = [order[i:i + batch] for i in range(0, reads, batch)]
        fetch = lambda ix: sum(map(len, src._getitems(ix)))  # noqa: E731
    else:
        calls = order
        fetch = lambda i: len(src[i])  # noqa: E731
    start = time.perf_counter()
    if threads == 1:
        total = sum(map(fetch, calls))
    else:
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(fetch, calls))
    seconds = time.perf_counter() - start
    return reads / seconds, total / 1e6 / seconds


def images_per_second(it, batch: int, batches: int, warmup: int) -> float:
    """Images/s over `batches` batches after `warmup` (pipelines work ahead: time many more batches than that)."""
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        assert len(next(it)["image"]) == batch
    return batches * batch / (time.perf_counter() - start)


def tfdata(paths: list[str], batch: int):
    """Sequential tf.data: every shard read in parallel, parse, decode_jpeg, batch."""
    import tensorflow as tf

    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        return {"image": tf.io.decode_jpeg(ex["image/encoded"], channels=3), "label": ex["image/class/label"]}

    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=tf.data.AUTOTUNE).repeat()
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
    return iter(ds.as_numpy_iterator())


def grain_random(src, batch: int, threads: int):
    """Grain in random order: index lookups, ranged reads, Pillow decode, batch, `threads` reader threads."""
    import grain

    from shard_utils.read.random_access import Decoder

    ds = grain.MapDataset.source(src).seed(0).shuffle().repeat().map(Decoder.for_source(src)).batch(batch)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads)))


def emulator(dataset: Path):
    """Start gcp-storage-emulator on loopback, upload the dataset; returns (process, gs:// URI)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()", "start",
                             "--host=127.0.0.1", f"--port={port}", "--in-memory", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    from gcs_fixtures import _wait_healthy

    _wait_healthy(os.environ["STORAGE_EMULATOR_HOST"], proc)
    from shard_utils import storage

    client = storage.gcs_client()
    bucket = client.create_bucket("bench")
    for path in sorted(p for p in dataset.iterdir() if p.is_file()):
        bucket.blob(f"ds/{path.name}").upload_from_filename(str(path))
    return proc, "gs://bench/ds"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for generated images and shards (default: a temp dir)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--source-size", type=int, default=400)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--reads", type=int, default=2000, help="random reads per local measurement")
    ap.add_argument("--gcs-reads", type=int, default=300, help="random reads per emulator measurement (0: skip)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=48, help="timed batches per pipeline")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args(argv)
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_random_access_"))
    data.mkdir(parents=True, exist_ok=True)
    dataset = build(data, args.images, args.source_size, args.image_size)

    from shard_utils.format.manifest import load
    from shard_utils.read.random_access import RandomAccessSource

    m = load(str(dataset))
    split = "train" if "train" in m.splits else sorted(m.splits)[0]
    src = RandomAccessSource(m, split)
    size = m.split(split).num_bytes / 1e6
    print(f"\n{len(src)} records in {len(m.split(split).shards)} shards ({size:.1f} MB), "
          f"{args.image_size}x{args.image_size} JPEG; {os.cpu_count()} CPUs")
    rows = [("local, src[i]", reads_per_second(src, args.reads)),
            (f"local, src[i], {args.threads} threads", reads_per_second(src, args.reads, args.threads)),
            (f"local, _getitems({args.batch})", reads_per_second(src, args.reads, batch=args.batch))]
    proc = None
    try:
        if args.gcs_reads:
            proc, uri = emulator(dataset)
            remote = RandomAccessSource(uri, split)
            rows += [("emulator, src[i]", reads_per_second(remote, args.gcs_reads)),
                     (f"emulator, src[i], {args.threads} threads",
                      reads_per_second(remote, args.gcs_reads, args.threads)),
                     (f"emulator, _getitems({args.batch})", reads_per_second(remote, args.gcs_reads, batch=args.batch))]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"{'random reads':38} {'records/s':>10} {'MB/s':>8}")
    for name, (rate, mb) in rows:
        print(f"{name:38} {rate:10.0f} {mb:8.1f}")
    print(f"{'decode + batch ' + str(args.batch):38} {'images/s':>10}")
    pipelines = {"tf.data sequential (decode_jpeg)": lambda: tfdata(m.shard_paths(split), args.batch),
                 f"Grain random ({args.threads} threads, Pillow)": lambda: grain_random(src, args.batch, args.threads)}
    for name, make in pipelines.items():
        print(f"{name:38} {images_per_second(make(), args.batch, args.batches, 2 + args.threads):10.0f}")


if __name__ == "__main__":
    sys.exit(main())
