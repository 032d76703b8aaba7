"""TensorFlow's per-replica datasets without autotuning, for tests that train under MirroredStrategy.

TensorFlow's MultiDeviceIterator gives each replica a dataset of its own (a generator and a prefetch of 1), with
default options: autotuning on, so each runs a model thread. Deleting such an iterator waits for that thread's timed
sleep to end (seconds to a minute, 0.1 CPU second: not woken by the cancellation) and Keras deletes one at every
validation and evaluate, whatever the pipeline (a Dataset.range one too). Nothing there is tunable, so turning it
off changes no element; the loader's own pipeline keeps its options. A missing name fails loudly.

    python tests/untuned_replicas.py examples/resume_keras.py ARGS...   # the script as run, with the change
"""
from __future__ import annotations

import os
import runpy
import sys


def install() -> None:
    """From now on in this process, the per-replica datasets run without autotuning (once is enough)."""
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops

    device_dataset = multi_device_iterator_ops._create_device_dataset
    if getattr(device_dataset, "untuned", False):
        return
    options = tf.data.Options()
    options.autotune.enabled = False

    def untuned(*args, **kwargs):
        return device_dataset(*args, **kwargs).with_options(options)

    untuned.untuned = True  # type: ignore[attr-defined]
    multi_device_iterator_ops._create_device_dataset = untuned


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    install()
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as Python runs the script itself
    runpy.run_path(sys.argv[0], run_name="__main__")
