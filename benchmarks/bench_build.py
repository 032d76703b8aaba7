"""Throughput and memory of the build job against a tutorial-style TF loop and a plain Pillow loop.

    python benchmarks/bench_build.py [--count 2000] [--big 8000] [--work bench_work]

Prints images/s and MB/s (of source bytes) for pass-through input (JPEG) and re-encode
input (PNG), the job's peak memory at --count and --big images, and two rates without the
pipeline's fixed cost: "steady" (against a run on --tiny images of the same kind) and, for
JPEG, "marginal" (between --count and --big). Each job runs in a fresh process on Beam's
in-process runner with one worker, so it uses about one core; Beam's import (about 1 s) is
never counted, the job's own start-up is.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent


def make_photos(root: Path, count: int, fmt: str, ext: str, labels: int = 10) -> int:
    """`count` photo-like ~400x400 images in `labels` folders; returns total bytes."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:400, 0:400].astype(np.float32)
    total = 0
    for i in range(count):
        h, w = 400 - (i % 5) * 16, 400 - (i % 7) * 12
        fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
        base = np.stack([np.sin(xx * fx + phase), np.cos(yy * fy - phase), np.sin((xx + yy) * fx * fy * 20)], -1)
        pixels = (base[:h, :w] * 90 + 128 + rng.normal(0, 6, (h, w, 3))).clip(0, 255).astype(np.uint8)
        folder = root / f"class{i % labels}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:06d}.{ext}"
        Image.fromarray(pixels).save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {"compress_level": 6}))
        total += path.stat().st_size
    return total


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def tutorial_loop(root: Path, out: Path) -> float:
    """The usual notebook approach: tf.io decode and encode per image, one TFRecordWriter."""
    import tensorflow as tf

    labels = {name: i for i, name in enumerate(sorted(os.listdir(root)))}
    start = time.perf_counter()
    with tf.io.TFRecordWriter(str(out)) as writer:
        for path in files_of(root):
            image = tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False)
            encoded = tf.io.encode_jpeg(image, quality=95).numpy()
            feature = {
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[path.parent.name]])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return time.perf_counter() - start


def pillow_loop(root: Path) -> float:
    """The CPU floor: Pillow decode + JPEG encode of each image, nothing else."""
    start = time.perf_counter()
    for path in files_of(root):
        with Image.open(path) as image:
            buf = io.BytesIO()
            image.convert("RGB").save(buf, "JPEG", quality=95)
    return time.perf_counter() - start


def measure_job(input_dir: Path, output_dir: Path, *extra: str) -> dict:
    """Run the job in a fresh process; its wall time and peak RSS (MB)."""
    code = (
        "import json, sys, time\n"
        "from beam_jobs.build_shards import run\n"
        "t = time.perf_counter()\n"
        f"run(['--input', {str(input_dir)!r}, '--output', {str(output_dir)!r}, '--overwrite', *{list(extra)!r}])\n"
        "secs = time.perf_counter() - t\n"
        # VmHWM, not ru_maxrss: ru_maxrss survives fork+exec and would report this benchmark's own size.
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print(json.dumps({'seconds': secs, 'peak_mb': int(hwm) / 1024}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode:
        raise SystemExit(f"job failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--big", type=int, default=8000, help="size of the memory-scaling run (0 to skip)")
    ap.add_argument("--tiny", type=int, default=16, help="size of the run that measures the fixed cost")
    ap.add_argument("--work", default="bench_work")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    print(f"machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}")
    for kind, fmt, ext in (("pass-through (JPEG in)", "JPEG", "jpg"), ("re-encode (PNG in)", "PNG", "png")):
        src = work / f"src-{ext}"
        mb = make_photos(src, args.count, fmt, ext) / 1e6
        naive = tutorial_loop(src, work / f"naive-{ext}.tfrecord")
        floor = pillow_loop(src)
        make_photos(work / f"tiny-{ext}", args.tiny, fmt, ext)
        fixed = measure_job(work / f"tiny-{ext}", work / f"out-tiny-{ext}")["seconds"]
        runs = [("tpu-shards job", measure_job(src, work / f"out-{ext}"))]
        if ext == "jpg":
            runs.append(("job --validate structure", measure_job(src, work / f"out-{ext}", "--validate", "structure")))
        print(f"\n{kind}: {args.count} images, {mb:.1f} MB source; the job's fixed cost "
              f"{fixed:.2f} s ({args.tiny} images)")
        print(f"  {'tutorial tf.io loop':26s}{args.count / naive:8.1f} img/s {mb / naive:7.1f} MB/s")
        print(f"  {'plain Pillow loop':26s}{args.count / floor:8.1f} img/s {mb / floor:7.1f} MB/s")
        for name, job in runs:
            secs = job["seconds"]
            print(f"  {name:26s}{args.count / secs:8.1f} img/s {mb / secs:7.1f} MB/s   "
                  f"{naive / secs:.2f}x tutorial, {floor / secs:.2f}x Pillow, peak {job['peak_mb']:.0f} MB")
            steady = (args.count - args.tiny) / max(1e-9, secs - fixed)
            print(f"  {'  steady (minus fixed)':26s}{steady:8.1f} img/s {'':12s}   "
                  f"{steady / (args.count / naive):.2f}x tutorial, {steady / (args.count / floor):.2f}x Pillow")
        if args.big and ext == "jpg":
            big_src = work / "src-big"
            make_photos(big_src, args.big, fmt, ext)
            for name, small, extra in (("job", runs[0][1], ()), ("job --validate structure", runs[1][1],
                                                                 ("--validate", "structure"))):
                big = measure_job(big_src, work / "out-big", *extra)
                marginal = (args.big - args.count) / max(1e-9, big["seconds"] - small["seconds"])
                print(f"  {name} at {args.big} images: {args.big / big['seconds']:.1f} img/s, peak "
                      f"{big['peak_mb']:.0f} MB = {big['peak_mb'] / small['peak_mb']:.2f}x the peak at {args.count}; "
                      f"marginal {marginal:.1f} img/s = {marginal / (args.count / naive):.2f}x tutorial")
            shutil.rmtree(big_src, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
