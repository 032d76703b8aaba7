"""Run by the loader tests in a subprocess: the loader under MirroredStrategy on 8 logical CPU devices.

MirroredStrategy over `distribute_datasets_from_function` is the input path TPUStrategy takes too.
Logical devices must be configured before TensorFlow initializes its devices, so this runs in its
own process. Prints one JSON line of findings for the test to assert on.

    python strategy_check.py fit DATASET --global-batch 16 --epochs 2 [--eval-steps-per-execution 3]
                                 [--features embedding]
    python strategy_check.py shapes DATASET [DATASET ...] --global-batch 16
    python strategy_check.py evaluate DATASET --global-batch 16

Several checks joined by `+` run one after the other in one process (TensorFlow starts once), each printing its
own RESULT line: `python strategy_check.py fit A --epochs 2 + evaluate A`.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)

import keras  # noqa: E402
from untuned_replicas import install  # noqa: E402

install()  # Keras deletes a distributed iterator at every validation: not waiting seconds for TensorFlow's threads

from shard_utils.read import loader  # noqa: E402 - after the CPU devices are configured


class WeightSum(keras.metrics.Metric):
    """The sum of sample weights seen: the number of real records an evaluation counted."""

    def __init__(self, name: str = "weight_sum", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        weights = keras.ops.ones_like(y_true, "float32") if sample_weight is None else sample_weight
        self.total.assign_add(keras.ops.sum(keras.ops.cast(weights, "float32")))

    def result(self):
        return self.total


def build_model(manifest, features: str, input_shape) -> keras.Model:
    """A tiny CNN on images, or a Dense head on embeddings (pooled over frames if the embedding is per frame)."""
    inputs = keras.Input(input_shape)
    if features == "embedding":
        x = inputs if len(input_shape) == 1 else keras.layers.GlobalAveragePooling1D()(inputs)
        x = keras.layers.Dense(16, activation="relu")(x)
    else:
        x = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(manifest.num_classes)(x))


def fit(args) -> dict:
    """Train for --epochs with validation after each, then evaluate; compare with exact per-record accuracy.

    With --eval-steps-per-execution k, the model is then recompiled with steps_per_execution=k and evaluated
    twice more on a dataset made for k. (Keras 3.15's fit fails under MirroredStrategy with k > 1 whatever the
    data, so training runs one step per execution.)
    """
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    manifest = loader.load_manifest(args.datasets[0])
    gb, features = args.global_batch, args.features

    def train_fn(ctx):
        return loader.make_dataset(manifest, "train", ctx.get_per_replica_batch_size(gb), input_context=ctx, seed=1,
                                   features=features)

    def eval_fn(ctx, as_dict=False, repeat=True, spe=1):
        return loader.make_dataset(manifest, "validation", ctx.get_per_replica_batch_size(gb), training=False,
                                   input_context=ctx, as_dict=as_dict, features=features, repeat=repeat,
                                   steps_per_execution=spe)

    def compile_model(model, spe):
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy", WeightSum()], steps_per_execution=spe)

    keras.utils.set_random_seed(0)  # the model's initial weights: the fit's outcome does not depend on luck
    train = strategy.distribute_datasets_from_function(train_fn)
    val = strategy.distribute_datasets_from_function(eval_fn)
    steps = loader.steps_per_epoch(manifest, "train", gb)
    vsteps = loader.eval_steps(manifest, "validation", gb)
    input_spec = train_fn(tf.distribute.InputContext(1, 0, 8)).element_spec[0]
    with strategy.scope():
        model = build_model(manifest, features, input_spec.shape[1:])
        compile_model(model, 1)

    key = "embedding" if features == "embedding" else manifest.media
    exact = []

    def exact_accuracy() -> tuple[list[str], float]:
        """Accuracy over the real records of one pass, computed without the loader's padding."""
        seen, correct = [], 0
        one_pass = strategy.distribute_datasets_from_function(lambda ctx: eval_fn(ctx, as_dict=True, repeat=False))
        for element in one_pass:
            for d in strategy.experimental_local_results(element):
                guesses = model(d[key], training=False).numpy().argmax(-1)
                for source, label, weight, guess in zip(d["source_id"].numpy(), d["label"].numpy(),
                                                        d["weight"].numpy(), guesses, strict=True):
                    if weight:
                        seen.append(source.decode())
                        correct += int(guess == label)
        return seen, correct / max(1, len(seen))

    on_epoch_end = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: exact.append(exact_accuracy()[1]))
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=val,
                        validation_steps=vsteps, callbacks=[on_epoch_end], verbose=0)
    evaluated = model.evaluate(val, steps=vsteps, return_dict=True, verbose=0)
    seen, final = exact_accuracy()
    spe_runs, spe_steps = [], None
    if args.eval_steps_per_execution > 1:
        spe = args.eval_steps_per_execution
        with strategy.scope():
            compile_model(model, spe)
        spe_steps = loader.eval_steps(manifest, "validation", gb, steps_per_execution=spe)
        val_spe = strategy.distribute_datasets_from_function(lambda ctx: eval_fn(ctx, spe=spe))
        spe_runs = [model.evaluate(val_spe, steps=spe_steps, return_dict=True, verbose=0) for _ in range(2)]
    return {
        "replicas": strategy.num_replicas_in_sync, "steps": steps, "vsteps": vsteps, "spe_steps": spe_steps,
        "spe_accuracy": [r["accuracy"] for r in spe_runs], "spe_weight_sum": [r["weight_sum"] for r in spe_runs],
        "train_spec": [s.shape.as_list() for s in train_fn(tf.distribute.InputContext(1, 0, 8)).element_spec],
        "loss": history.history["loss"], "val_accuracy": history.history["val_accuracy"],
        "val_weight_sum": history.history["val_weight_sum"], "exact_per_epoch": exact,
        "eval_accuracy": evaluated["accuracy"], "eval_weight_sum": evaluated["weight_sum"],
        "exact_accuracy": final, "seen": seen,
    }


def evaluate(args) -> dict:
    """The validation loss of two models, through the loader's padded evaluation on 8 replicas, as Keras reports
    it (loss with the default and with the mean_with_sample_weight reduction) and as a weighted metric, beside
    the exact mean over the real records computed here: a model of zero logits (ln K) and a random one."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    manifest = loader.load_manifest(args.datasets[0])
    gb = args.global_batch
    val = strategy.distribute_datasets_from_function(lambda ctx: loader.make_dataset(
        manifest, "validation", ctx.get_per_replica_batch_size(gb), training=False, input_context=ctx))
    steps = loader.eval_steps(manifest, "validation", gb)
    found = {"records": manifest.num_records("validation"), "steps": steps, "num_classes": manifest.num_classes}
    for name, kernel in (("zero", "zeros"), ("random", "glorot_uniform")):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            inputs = keras.Input(tuple(manifest.image_size) + (3,))
            model = keras.Model(inputs, keras.layers.Dense(manifest.num_classes, kernel_initializer=kernel)(
                keras.layers.Flatten()(inputs)))
        result = {}
        for reduction in ("sum_over_batch_size", "mean_with_sample_weight"):
            with strategy.scope():
                model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction),
                              weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True,
                                                                                             name="cross_entropy")])
            got = model.evaluate(val, steps=steps, return_dict=True, verbose=0)
            result[reduction] = got["loss"]
            result["cross_entropy"] = got["cross_entropy"]
        losses = []
        for image, label, weight in loader.make_dataset(manifest, "validation", 8, training=False, repeat=False):
            per_record = keras.losses.sparse_categorical_crossentropy(label, model(image), from_logits=True)
            losses += [float(x) for x, w in zip(per_record.numpy(), weight.numpy(), strict=True) if w]
        result["exact"] = sum(losses) / len(losses)
        found[name] = result
    return found


def shapes(args) -> dict:
    """Per-replica shapes of the train and eval dicts of each dataset: as a compiled step sees them
    (None = not static), and of the first batch's values."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    out = {}
    for path in args.datasets:
        manifest = loader.load_manifest(path)
        found = {}
        for mode, training in (("train", True), ("eval", False)):
            split = "train" if training else "validation"
            dist = strategy.distribute_datasets_from_function(
                lambda ctx, manifest=manifest, split=split, training=training: loader.make_dataset(
                    manifest, split, ctx.get_per_replica_batch_size(args.global_batch), training=training,
                    input_context=ctx, as_dict=True, seed=2))
            traced = {}

            def replica_step(d, traced=traced):
                traced.update({k: v.shape.as_list() for k, v in d.items()})  # recorded while tracing
                return tf.constant(0)

            element = next(iter(dist))
            tf.function(lambda e: strategy.run(replica_step, args=(e,)))(element)
            local = strategy.experimental_local_results(element)
            found[mode] = {"spec": traced, "replicas": len(local),
                           "values": {k: list(v.shape) for k, v in local[0].items()}}
        out[path] = found
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fit", "shapes", "evaluate"])
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-steps-per-execution", type=int, default=1)
    parser.add_argument("--features", default="media")
    words = sys.argv[1:]
    while words:
        ends = words.index("+") if "+" in words else len(words)
        arguments = parser.parse_args(words[:ends])
        print("RESULT " + json.dumps({"fit": fit, "shapes": shapes, "evaluate": evaluate}[arguments.mode](arguments)),
              flush=True)
        words = words[ends + 1:]
