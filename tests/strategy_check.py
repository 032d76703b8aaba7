"""Run by test_loader in a subprocess: the loader under MirroredStrategy on 8 logical CPU devices.

Logical devices must be configured before TensorFlow initializes its devices, so this runs in
its own process. Prints one JSON line of findings for the test to assert on.
Usage: python strategy_check.py DATASET GLOBAL_BATCH
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)

import keras  # noqa: E402

from shard_utils import loader  # noqa: E402


def main(dataset: str, global_batch: int) -> dict:
    """Train one epoch, validate and evaluate through distribute_datasets_from_function; report what was seen."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    manifest = loader.load_manifest(dataset)
    per_replica = global_batch // strategy.num_replicas_in_sync

    def train_fn(ctx):
        return loader.make_dataset(manifest, "train", ctx.get_per_replica_batch_size(global_batch),
                                   input_context=ctx, seed=1)

    def eval_fn(ctx, as_dict=False):
        return loader.make_dataset(manifest, "validation", ctx.get_per_replica_batch_size(global_batch),
                                   training=False, input_context=ctx, as_dict=as_dict)

    train = strategy.distribute_datasets_from_function(train_fn)
    val = strategy.distribute_datasets_from_function(eval_fn)
    steps = loader.steps_per_epoch(manifest, "train", global_batch)
    vsteps = loader.eval_steps(manifest, "validation", global_batch)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((*manifest.image_size, 3)),
            keras.layers.Conv2D(4, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(manifest.num_classes),
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
    history = model.fit(train, epochs=1, steps_per_epoch=steps, validation_data=val, validation_steps=vsteps,
                        verbose=0)
    evaluated = model.evaluate(val, steps=vsteps, return_dict=True, verbose=0)

    # Exact accuracy over the real records, computed without the loader's padding.
    seen, correct, batches = [], 0, 0
    for element in strategy.distribute_datasets_from_function(lambda ctx: eval_fn(ctx, as_dict=True)):
        batches += 1
        for d in strategy.experimental_local_results(element):
            logits = model(d["image"], training=False).numpy()
            for source, label, weight, guess in zip(d["source_id"].numpy(), d["label"].numpy(),
                                                    d["weight"].numpy(), logits.argmax(-1)):
                if weight:
                    seen.append(source.decode())
                    correct += int(guess == label)
    spec = train_fn(tf.distribute.InputContext(1, 0, strategy.num_replicas_in_sync)).element_spec
    return {
        "replicas": strategy.num_replicas_in_sync, "per_replica": per_replica, "steps": steps, "vsteps": vsteps,
        "loss": history.history["loss"], "val_accuracy": history.history["val_accuracy"],
        "eval_accuracy": evaluated["accuracy"], "exact_accuracy": correct / max(1, len(seen)),
        "seen": seen, "eval_batches": batches, "train_spec": [s.shape.as_list() for s in spec],
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], int(sys.argv[2]))))
