"""Keras training that survives a kill: BackupAndRestore(save_freq=N), and the input resumes at the restored step.

The recipe of docs/resume.md, runnable on 8 logical CPU devices under MirroredStrategy (the distributed input
path TPUStrategy takes; on a TPU only the strategy changes). Kill it at any moment (SIGKILL) and start it again:
BackupAndRestore restores the weights and the optimizer, whose `iterations` is the global step, and
`make_dataset(..., seed=S, start_step=iterations)` continues with exactly the records that step would have had.

    python examples/resume_keras.py DATASET --backup /tmp/backup --epochs 3 [--log steps.log]

Prints `START k` (the restored step), `BATCH k` after each step, `VAL <records counted>` after each
evaluation; with --log, every replica appends `STEP k <replica> [<fingerprints>]` for each step it trains, the
fingerprint of a source id being `tf.strings.to_hash_bucket_fast(source_id, 2**62)` (to check the data).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

DEVICES = 8
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * DEVICES)

import keras  # noqa: E402

from shard_utils import loader  # noqa: E402


class StopAtStep(keras.callbacks.Callback):
    """Ends training at `last` optimizer steps. After a restore, Keras replays the interrupted epoch from its first
    batch (BackupAndRestore records the epoch only) while the data continues at the restored step; this keeps
    the total at epochs x steps_per_epoch."""

    def __init__(self, last: int):
        super().__init__()
        self.last = last

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.last:
            self.model.stop_training = True


class Progress(keras.callbacks.Callback):
    """Prints the step just trained and, after each evaluation, how many real records it counted."""

    def on_train_batch_end(self, batch, logs=None):
        print(f"BATCH {int(self.model.optimizer.iterations.numpy()) - 1}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"VAL {int(logs['val_records'])}", flush=True)


class Records(keras.metrics.Metric):
    """The sum of sample weights: how many real (not padding) records an evaluation counted."""

    def __init__(self, name: str = "records", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        weights = keras.ops.ones_like(y_true, "float32") if sample_weight is None else sample_weight
        self.total.assign_add(keras.ops.sum(keras.ops.cast(weights, "float32")))

    def result(self):
        return self.total


class LoggedModel(keras.Model):
    """A functional model trained on dict batches; with a log path, each replica appends the source ids it trains."""

    log: str | None = None

    def train_step(self, data):
        image, label, record = data
        if self.log:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            tf.print("STEP", self.optimizer.iterations, replica, record, summarize=-1,
                     output_stream=f"file://{self.log}")
        return super().train_step((image, label))


def fingerprinted(batch: dict) -> tuple:
    """(image, label, source id fingerprints): Keras' distributed input carries no strings, so each source id
    travels as `tf.strings.to_hash_bucket_fast(source_id, 2**62)` (where Keras puts sample weights, which
    train_step takes back out)."""
    return batch["image"], batch["label"], tf.strings.to_hash_bucket_fast(batch["source_id"], 2**62)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--backup", required=True, help="BackupAndRestore's folder")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--save-freq", type=int, default=2, help="back up every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", help="append each replica's trained source ids here")
    args = ap.parse_args()

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(DEVICES)])  # TPUStrategy on a TPU
    m = loader.load_manifest(args.dataset)
    global_batch = args.global_batch
    steps = loader.steps_per_epoch(m, "train", global_batch)
    with strategy.scope():
        inputs = keras.Input(tuple(m.image_size) + (3,))
        x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs))
        model = LoggedModel(inputs, keras.layers.Dense(m.num_classes)(x))
        model.log = args.log
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy", Records()])

        # Restore now, before the input exists: the step it resumes at is the restored optimizer's iterations.
        backup = keras.callbacks.BackupAndRestore(args.backup, save_freq=args.save_freq, double_checkpoint=True)
        backup.set_model(model)
        backup.on_train_begin()
    start = int(model.optimizer.iterations.numpy())
    print(f"START {start}", flush=True)

    train = strategy.distribute_datasets_from_function(lambda ctx: loader.make_dataset(
        m, "train", ctx.get_per_replica_batch_size(global_batch), input_context=ctx, seed=args.seed,
        start_step=start, as_dict=True).map(fingerprinted))
    validation = strategy.distribute_datasets_from_function(lambda ctx: loader.make_dataset(
        m, "validation", ctx.get_per_replica_batch_size(global_batch), training=False, input_context=ctx))
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=validation,
              validation_steps=loader.eval_steps(m, "validation", global_batch), verbose=0, shuffle=False,
              callbacks=[backup, StopAtStep(args.epochs * steps), Progress()])


if __name__ == "__main__":
    main()
