"""Deleting a distributed iterator under MirroredStrategy on 8 logical CPU devices, as Keras does after each
validation and evaluate: the loader's evaluation dataset against one of zeros of the same element shapes
(from_tensors, repeat, prefetch), with TensorFlow's per-replica device datasets autotuned (its default) and not.

Each round makes an iterator, runs steps through a tf.function for --age seconds, then deletes it; rounds
alternate between the four configurations. Printed per deletion: wall and CPU seconds.

    python benchmarks/bench_teardown.py --data DATASET [--age 5] [--rounds 2]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 8)

from tensorflow.python.data.ops import multi_device_iterator_ops  # noqa: E402

from shard_utils.read import loader  # noqa: E402

_device_dataset = multi_device_iterator_ops._create_device_dataset
_NOT_AUTOTUNED = tf.data.Options()
_NOT_AUTOTUNED.autotune.enabled = False
DEVICE_AUTOTUNE = [True]  # read when an iterator is made


def _per_device(*args, **kwargs) -> tf.data.Dataset:
    """TensorFlow's per-replica dataset, its autotuning as the round asks."""
    ds = _device_dataset(*args, **kwargs)
    return ds if DEVICE_AUTOTUNE[0] else ds.with_options(_NOT_AUTOTUNED)


multi_device_iterator_ops._create_device_dataset = _per_device


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="a built dataset with a validation split (images)")
    parser.add_argument("--age", type=float, default=5.0, help="seconds each iterator runs before deletion")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=16)
    args = parser.parse_args()
    manifest = loader.load_manifest(args.data)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    gb = args.global_batch

    def ours(ctx):
        return loader.make_dataset(manifest, "validation", ctx.get_per_replica_batch_size(gb), training=False,
                                   input_context=ctx)

    def trivial(ctx):
        spec = ours(ctx).element_spec
        zeros = tuple(tf.zeros(s.shape, s.dtype) for s in spec)
        return tf.data.Dataset.from_tensors(zeros).repeat().prefetch(tf.data.AUTOTUNE)

    @tf.function
    def step(iterator):
        return strategy.run(lambda image, label, weight: tf.reduce_sum(weight), args=next(iterator))

    datasets = {name: strategy.distribute_datasets_from_function(fn)
                for name, fn in (("loader", ours), ("zeros", trivial))}
    found: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for autotune in (True, False):
            for name, dist in datasets.items():
                DEVICE_AUTOTUNE[0] = autotune
                iterator = iter(dist)
                end = time.perf_counter() + args.age
                while time.perf_counter() < end:
                    step(iterator)
                    time.sleep(0.05)
                wall, cpu = time.perf_counter(), time.process_time()
                del iterator
                gc.collect()
                found.setdefault((name, autotune), []).append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"TF {tf.__version__}, 8 logical CPU devices on {os.cpu_count()} CPUs, iterators {args.age:g} s old, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'pipeline':15s} {'device autotune':16s} {'median s':>9s}  deletions: wall s (CPU s)")
    for (name, autotune), times in found.items():
        shown = "  ".join(f"{w:.2f} ({c:.2f})" for w, c in times)
        print(f"{name:15s} {'on (default)' if autotune else 'off':16s} {statistics.median(w for w, _ in times):9.2f}"
              f"  {shown}")


if __name__ == "__main__":
    main()
