"""JAX input throughput: make_iterator against Grain's recommended pipelines and the tf.data loader, side by side.

One dataset built by the real job with --format both (the same records as TFRecord and as ArrayRecord shards).
Every candidate decodes the JPEG, resizes it to --resize, scales to [0, 1] and yields training batches of --batch
as jax.Arrays sharded on a "data" mesh over this host's devices, each batch waited for:

  make_iterator                  shard_utils.jax_loader.make_iterator(manifest, "train", batch, image_size=)
  make_iterator, resumed         the same with seed=0, start_step= 90 % of an epoch (a run resumed mid-epoch)
  make_iterator, tensorflow      the same with decoder="tensorflow" (tf.data decodes and resizes underneath)
  make_iterator, N threads       the same with threads=N (--threads N,M,...: one candidate per count)
  Grain threads                  Grain's JAX tutorial over ArrayRecordDataSource (the ArrayRecord twins):
                                 MapDataset.source().seed().shuffle().repeat().map(decode + resize)
                                 .batch(drop_remainder=True).to_iter_dataset(ReadOptions()), then
                                 grain.experimental.device_put(ds, sharding)
  Grain mp_prefetch              the same with .mp_prefetch(MultiprocessingOptions(num_workers=CPUs)) before
                                 device_put, as Grain's docs advise for CPU-heavy maps
  tf.data make_dataset           shard_utils.loader.make_dataset(training=True) over the TFRecord twins, its NumPy
                                 batches placed with jax.make_array_from_process_local_data

Grain's map is what a Grain user writes: Pillow decode, bilinear resize, float32 / 255. Rounds alternate between
the candidates (the order turning each round) so a shared machine's load hits all alike; ratios are medians of
each round's ratio. CPU time counts this process and its worker processes.

    python benchmarks/bench_jax.py --data /tmp/bench_jax          # 1024 photo-like 400x400 JPEGs, built once
    python benchmarks/bench_jax.py --data /tmp/bench_jax --rounds 5
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import numpy as np  # noqa: E402
from bench_loader import build, dataset_options  # noqa: E402

# Each candidate's name, and the pairs whose ratio the issue sets a target for (numerator, denominator, target).
JAX, RESUMED, JAX_TF, GRAIN_THREADS, GRAIN_MP, TFDATA = (
    "make_iterator", "make_iterator, resumed", "make_iterator, tensorflow", "Grain threads", "Grain mp_prefetch",
    "tf.data make_dataset")
TARGETS = ((JAX, GRAIN_THREADS, 1.0), (JAX, GRAIN_MP, 1.0), (JAX, TFDATA, 0.9), (RESUMED, JAX, 0.9),
           (JAX_TF, TFDATA, 0.9))


class DecodeResize:
    """Grain map function: a serialized tf.train.Example to {"image": float32 [size, size, 3] in [0, 1], "label"},
    with Pillow, as a Grain user writes it (picklable, for mp_prefetch's worker processes)."""

    def __init__(self, size: int, label_offset: int = 0):
        self.size, self.label_offset = size, label_offset

    def __call__(self, record: bytes) -> dict[str, np.ndarray]:
        from PIL import Image

        from shard_utils.format import schema

        fields = schema.decode_lists(record)
        with Image.open(io.BytesIO(fields[schema.IMAGE_ENCODED][0])) as image:
            pixels = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        label = schema.label_ids_of(fields[schema.LABEL], self.label_offset)[0]
        return {"image": np.asarray(pixels, dtype=np.float32) / 255.0, "label": np.int32(label)}


def grain_recommended(paths: list[str], size: int, batch: int, label_offset: int, workers: int, sharding):
    """Grain's documented training pipeline over ArrayRecord shards, ending on the devices."""
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # mp_prefetch reads an absl flag, as under absl.app.run, Grain's usual entry
        flags.FLAGS(sys.argv[:1])
    ds = (grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths)).seed(0).shuffle().repeat()
          .map(DecodeResize(size, label_offset)).batch(batch, drop_remainder=True)
          .to_iter_dataset(grain.ReadOptions()))
    if workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return iter(grain.experimental.device_put(ds, sharding))


def tf_data(m, split: str, size: int, batch: int, sharding):
    """The tf.data loader's NumPy batches, placed on the devices as docs/loader.md shows."""
    import jax

    from shard_utils.read import loader

    for element in loader.make_dataset(m, split, batch, image_size=size, as_dict=True).as_numpy_iterator():
        yield {key: jax.make_array_from_process_local_data(sharding, element[key]) for key in ("image", "label")}


def process_tree_cpu() -> float:
    """CPU seconds so far of this process and its live descendants (Grain's worker processes), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = time.process_time(), [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                for kid in kids:
                    with open(f"/proc/{kid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
                todo += kids
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker that ended meanwhile
    return total


def throughput(it, batch: int, batches: int, warmup: int) -> tuple[float, float]:
    """(images/s, CPU ms per image) over `batches` batches, each waited for, after `warmup` batches (start-up,
    tracing, workers) are discarded; the iterator is closed after."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(next(it))
    start, cpu = time.perf_counter(), process_tree_cpu()
    for _ in range(batches):
        jax.block_until_ready(next(it))
    wall, cpu = time.perf_counter() - start, process_tree_cpu() - cpu
    getattr(it, "close", lambda: None)()
    return batches * batch / wall, cpu * 1e3 / (batches * batch)


def progress(round_: int, name: str, result: tuple[float, float], seconds: float) -> None:
    """One measurement as soon as it is made, on stderr: a run cut short still shows what it measured."""
    print(f"round {round_ + 1}, {name}: {result[0]:.0f} images/s, {result[1]:.2f} CPU ms/image ({seconds:.1f} s with "
          f"start-up and warm-up)", file=sys.stderr, flush=True)


def report(results: dict[str, list[tuple[float, float]]], header: str) -> list[str]:
    """The table: median images/s and CPU per image, each round's images/s, then the paired ratios and targets."""
    lines = [header, f"{'pipeline':32} {'images/s':>9} {'CPU ms/image':>13}   images/s per round"]
    for name, runs in results.items():
        lines.append(f"{name:32} {statistics.median(r[0] for r in runs):9.0f} "
                     f"{statistics.median(r[1] for r in runs):13.2f}   {' '.join(f'{r[0]:.0f}' for r in runs)}")
    for top, bottom, target in TARGETS:
        if top in results and bottom in results:
            ratio = statistics.median(a[0] / b[0] for a, b in zip(results[top], results[bottom], strict=True))
            cpu = statistics.median(b[1] / a[1] for a, b in zip(results[top], results[bottom], strict=True))
            lines.append(f"{top} / {bottom}: {ratio:.2f}x images/s (target >= {target}), {cpu:.2f}x images per "
                         f"CPU-second{'' if ratio >= target else '  BELOW TARGET'}")
    for name in results:
        if name.startswith(f"{JAX}, ") and name.endswith(" threads") and JAX in results:
            ratio = statistics.median(a[0] / b[0] for a, b in zip(results[name], results[JAX], strict=True))
            lines.append(f"{name} / {JAX}: {ratio:.2f}x images/s")
    return lines


def thread_counts(text: str) -> tuple[int, ...]:
    """--threads' comma-separated positive counts."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be at least 1: {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dataset_options(ap)
    ap.add_argument("--batches", type=int, default=24, help="timed batches per round (default 24)")
    ap.add_argument("--warmup", type=int, default=24,
                    help="batches discarded before timing (default 24: Grain's 16 threads start 16 batches at once)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--grain-workers", type=int, default=os.cpu_count(),
                    help="Grain mp_prefetch's worker processes (default: the CPU count)")
    ap.add_argument("--only", action="append", choices=(JAX, RESUMED, JAX_TF, GRAIN_THREADS, GRAIN_MP, TFDATA),
                    help="run only these candidates (repeatable; default all)")
    ap.add_argument("--threads", type=thread_counts, default=(),
                    help="also make_iterator with threads=N for each N of this comma-separated list")
    args = ap.parse_args(argv)
    data = Path(args.data or tempfile.mkdtemp(prefix="bench_jax_"))
    data.mkdir(parents=True, exist_ok=True)
    dataset = build(data, args.images, args.source_size, "both")

    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from shard_utils.format.manifest import load

    m = load(str(dataset))
    split = "train"
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))

    def jax_iterator(**options):
        def make():
            from shard_utils import jax_loader

            return iter(jax_loader.make_iterator(m, split, args.batch, image_size=args.resize, **options))
        return make

    def grain(workers: int):
        return lambda: grain_recommended(m.array_record_paths(split), args.resize, args.batch, m.label_offset,
                                         workers, sharding)

    late = int(0.9 * (m.num_records(split) // args.batch))
    candidates = {
        JAX: jax_iterator(),
        RESUMED: jax_iterator(seed=0, start_step=late),
        JAX_TF: jax_iterator(decoder="tensorflow"),
        GRAIN_THREADS: grain(0),
        GRAIN_MP: grain(args.grain_workers),
        TFDATA: lambda: tf_data(m, split, args.resize, args.batch, sharding),
    }
    candidates = {name: make for name, make in candidates.items() if not args.only or name in args.only}
    candidates.update({f"{JAX}, {n} threads": jax_iterator(threads=n) for n in args.threads})
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    names = list(candidates)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            began = time.perf_counter()
            results[name].append(throughput(candidates[name](), args.batch, args.batches, args.warmup))
            progress(round_, name, results[name][-1], time.perf_counter() - began)
    header = (f"\n{m.num_records(split)} records in {len(m.split(split).shards)} shards per format, "
              f"{args.source_size}x{args.source_size} JPEG -> {args.resize}x{args.resize} float32, batch {args.batch}, "
              f"{len(jax.devices())} {jax.devices()[0].platform} device(s); jax {jax.__version__}, {os.cpu_count()} "
              f"CPUs, Grain mp_prefetch {args.grain_workers} workers, resumed at step {late}; "
              f"median of {args.rounds} alternating rounds")
    print("\n".join(report(results, header)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
