"""Run by tests/test_kaggle.py in a subprocess, in a folder holding comp/, train_shards/ and test_shards/: train eight
epochs on 8 replicas (MirroredStrategy over 8 logical CPU devices, as the README does), then run docs/loader.md's
submission snippet as written. Prints one JSON line: each test id's prediction made from its own file, for the
test to compare with submission.csv row by row.
"""
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)

from shard_utils import loader  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKED = re.compile(r"<!-- test: kaggle snippet -->\n```python\n(.*?)```", re.S)


def train(strategy: tf.distribute.Strategy) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)  # an unseeded start can predict one class for every test image
    manifest = loader.load_manifest("train_shards")
    batch = 2 * strategy.num_replicas_in_sync
    data = strategy.distribute_datasets_from_function(
        lambda ctx: loader.make_dataset(manifest, "train", ctx.get_per_replica_batch_size(batch), input_context=ctx,
                                        seed=0))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.GlobalAveragePooling2D(),
                                     tf.keras.layers.Dense(manifest.num_classes)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.1),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=8, steps_per_epoch=loader.steps_per_epoch(manifest, "train", batch), verbose=0)
    return model


def main() -> None:
    strategy = tf.distribute.MirroredStrategy()
    model = train(strategy)
    page = open(os.path.join(REPO, "docs", "loader.md"), encoding="utf-8").read()
    [snippet] = [s for s in MARKED.findall(page) if "submission.csv" in s]
    exec(snippet, {"model": model, "__name__": "snippet"})  # noqa: S102 - the docs' own snippet, as written
    labels = loader.load_manifest("train_shards").labels
    own = {}
    for name in sorted(os.listdir("comp/test_images")):
        image = tf.io.decode_jpeg(tf.io.read_file(f"comp/test_images/{name}"), 3)
        logits = model(tf.cast(image, tf.float32)[None] / 255.0, training=False)
        own[os.path.splitext(name)[0]] = labels[int(tf.argmax(logits[0]))]
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "own": own}))


if __name__ == "__main__":
    sys.exit(main())
