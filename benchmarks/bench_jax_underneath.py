"""What to put under the JAX iterator: Grain (what `shard_utils.jax_loader` uses) against the tf.data loader's
resumable path, both ending in global `jax.Array` batches on 8 CPU devices, on the same dataset (--format both).

Each candidate runs in its own process (no TensorFlow in the Grain ones), --rounds times, alternating so machine
load hits all alike; medians of images/s and of CPU ms per image (every thread of the process), decoding and
resizing to --resize (or, with --resize 0, at the stored size: nothing resized).

    python benchmarks/bench_jax_underneath.py --data /tmp/bench_jax --resize 224
    python benchmarks/bench_jax_underneath.py --data /tmp/bench_jax --resize 0
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CANDIDATES = {
    "grain-arrayrecord": "Grain, ArrayRecord shards (make_iterator's choice on this dataset)",
    "grain-tfrecord": "Grain, TFRecord shards through the index",
    "tfdata-resumable": "tf.data, the loader's resumable path (seed=, start_step=)",
}


def build(data: Path, count: int, width: int, height: int) -> Path:
    """`count` photo-like JPEGs of width x height, built once with --format both; the dataset folder."""
    sys.path.insert(0, str(HERE))
    from bench_loader import write_photos

    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import photo  # the tests' photo-like images: gradients and noise

    out = data / f"both-{count}-{width}x{height}"
    if (out / "manifest.json").exists():
        return out
    images = write_photos(data / f"images-{count}-{width}x{height}", count, lambda i: photo(width, height, seed=i))
    from beam_jobs.jobs.build import run

    with contextlib.redirect_stdout(io.StringIO()):
        run(["--input", str(images), "--output", str(out), "--splits", "train=1.0", "--format", "both"])
    return out


def measure(candidate: str, dataset: str, size: tuple[int, int], batch: int, batches: int) -> dict:
    """images/s and CPU ms per image of `batches` global batches after 2 warm-up batches, in this process."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np

    if candidate.startswith("grain"):
        import dataclasses

        from shard_utils.format.manifest import load
        from shard_utils.jax_loader import make_iterator

        m = load(dataset)
        if candidate == "grain-tfrecord":  # the same dataset seen without its ArrayRecord twins
            m = dataclasses.replace(m, splits={k: dataclasses.replace(v, array_record_shards=None)
                                               for k, v in m.splits.items()})
        it = make_iterator(m, "train", batch, seed=0, image_size=size)
    else:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from shard_utils import loader

        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
        numpy = loader.make_dataset(dataset, "train", batch, image_size=size, seed=0, start_step=0,
                                    as_dict=True).as_numpy_iterator()
        it = (jax.make_array_from_process_local_data({"image": sharding, "label": sharding},
                                                     {"image": b["image"], "label": b["label"]}) for b in numpy)
    for _ in range(2):
        jax.block_until_ready(next(it))
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        out = next(it)
    jax.block_until_ready(out)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"images_per_s": batches * batch / wall, "cpu_ms_per_image": cpu / (batches * batch) * 1000}


IMPORT = ("import resource, time; c = time.process_time(); import {0}; "
          "print(time.process_time() - c, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")


def import_cost(modules: str, env: dict) -> tuple[float, float]:
    """(CPU seconds, peak MB) of a fresh process importing `modules`."""
    done = subprocess.run([sys.executable, "-c", IMPORT.format(modules)], capture_output=True, text=True, env=env,
                          timeout=600, check=True)
    cpu, mb = done.stdout.split()[-2:]
    return float(cpu), float(mb)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder for generated images and shards (default: a temp dir)")
    ap.add_argument("--images", type=int, default=192)
    ap.add_argument("--source", default="320x240", help="stored WIDTHxHEIGHT of the JPEGs")
    ap.add_argument("--resize", type=int, default=224, help="square output size; 0: the stored size")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one candidate in this process
    ap.add_argument("--dataset", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.source.split("x"))
    size = (args.resize, args.resize) if args.resize else (height, width)
    if args.one:
        print("RESULT " + json.dumps(measure(args.one, args.dataset, size, args.batch, args.batches)))
        return
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_jax_"))
    data.mkdir(parents=True, exist_ok=True)
    dataset = build(data, args.images, width, height)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(HERE.parent)}
    results: dict[str, list[dict]] = {c: [] for c in CANDIDATES}
    for _ in range(args.rounds):
        for candidate in CANDIDATES:
            done = subprocess.run([sys.executable, __file__, "--one", candidate, "--dataset", str(dataset),
                                   "--source", args.source, "--resize", str(args.resize), "--batch", str(args.batch),
                                   "--batches", str(args.batches)], capture_output=True, text=True, env=env,
                                  timeout=600)
            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode or not line:
                raise SystemExit(f"{candidate} failed: {done.stderr[-2000:]}")
            results[candidate].append(json.loads(line[0][len("RESULT "):]))
    print(f"{args.images} JPEGs of {args.source}, {'resized to ' + str(args.resize) if args.resize else 'no resize'}, "
          f"global batch {args.batch} on 8 CPU devices, {os.cpu_count()} cores; medians of {args.rounds} rounds")
    for candidate, label in CANDIDATES.items():
        rate = statistics.median(r["images_per_s"] for r in results[candidate])
        cpu = statistics.median(r["cpu_ms_per_image"] for r in results[candidate])
        print(f"  {label:62s} {rate:7.0f} images/s  {cpu:5.2f} ms CPU/image")
    for modules in ("jax, grain", "jax, grain, tensorflow"):
        cpu, mb = import_cost(modules, env)
        print(f"  import {modules}: {cpu:.1f} s CPU, {mb:.0f} MB peak")


if __name__ == "__main__":
    main()
