"""Keras 3 on the JAX backend fed by the tf.data loader: docs/loader.md's block, run as written in a process of
its own (the backend and the 8 CPU devices are set before JAX starts), trains under `DataParallel` on the 8
devices, takes the steps it is given, and validates on every validation record once."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_job
from PIL import Image

from shard_utils.format.index import read_index
from shard_utils.format.manifest import load

CLASSES = ("blue", "green", "red")  # learnable in a few steps: each class is its colour, with noise
EPOCHS = 3  # as the block fits

# Run after the block, in its process: the facts the test checks, as one JSON line. The exact validation loss is
# computed here from one pass over the validation records, each read once (repeat=False), with the trained model.
FACTS = '''
import json
import numpy as np
ids, losses = [], []
for batch in loader.make_dataset(manifest, "validation", GLOBAL_BATCH, training=False, repeat=False, image_size=64,
                                 as_dict=True).as_numpy_iterator():
    logits = np.asarray(model.predict_on_batch(batch["image"]), dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    loss = np.log(np.exp(shifted).sum(axis=-1)) - shifted[np.arange(len(logits)), batch["label"]]
    real = batch["weight"] > 0
    ids += [s.decode() for s in batch["source_id"][real]]
    losses += loss[real].tolist()
print(json.dumps({
    "history": {k: [float(x) for x in v] for k, v in history.history.items()},
    "iterations": int(model.optimizer.iterations), "devices": len(jax.devices()),
    "weight_devices": len(model.weights[0].value.sharding.device_set),
    "distribution": type(keras.distribution.distribution()).__name__, "global_batch": GLOBAL_BATCH,
    "eval_steps": loader.eval_steps(manifest, "validation", GLOBAL_BATCH), "ids": ids,
    "exact_loss": float(np.mean(losses))}))
'''


def keras_jax_snippet() -> str:
    page = (REPO / "docs" / "loader.md").read_text(encoding="utf-8")
    [snippet] = re.findall(r"<!-- test: keras-jax snippet -->\n```python\n(.*?)```", page, re.S)
    return snippet


def colour_images(root, per_class: int = 32) -> None:
    for k, label in enumerate(CLASSES):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.random.default_rng(k * 1000 + i).integers(0, 100, (48, 48, 3))
            pixels[..., 2 - k] += 150  # blue, green, red
            Image.fromarray(pixels.astype(np.uint8)).save(root / label / f"{i:03d}.jpg", quality=90)


@pytest.fixture(scope="module")
def sample_output(tmp_path_factory):
    base = tmp_path_factory.mktemp("keras_jax")
    colour_images(base / "images")
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(base / "images", base / "sample_output", "--splits", "train=0.75,validation=0.25",
                "--image-size", "64", "--workers", "1")
    return base / "sample_output"


@pytest.mark.slow
@pytest.mark.tf  # the loader, in the block's process
def test_keras_3_on_jax_fits_on_8_devices_and_validates_on_every_record_once(sample_output):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "KERAS_BACKEND", "JAX_PLATFORMS")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", keras_jax_snippet() + FACTS], cwd=sample_output.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    m = load(str(sample_output))
    history, batch = facts["history"], facts["global_batch"]
    assert facts["distribution"] == "DataParallel" and facts["devices"] == facts["weight_devices"] == 8
    assert batch == 16 and all(len(v) == EPOCHS for v in history.values())
    assert facts["iterations"] == EPOCHS * (m.num_records("train") // batch)  # steps_per_epoch steps, each epoch
    loss = history["loss"]
    assert all(b < a for a, b in zip(loss, loss[1:], strict=False)) and loss[-1] < 0.85 * loss[0], loss
    # Validation: every record once (the loader's pass, read apart), and Keras's figures from exactly those records.
    with open(sample_output / m.split("validation").index.path, "rb") as f:
        expected = sorted(row.source_id for row in read_index(f))
    assert sorted(facts["ids"]) == expected and len(expected) == m.num_records("validation")
    exact, n = facts["exact_loss"], len(expected)
    assert n % batch and history["val_cross_entropy"][-1] == pytest.approx(exact, rel=1e-4)  # padding counts 0
    assert history["val_loss"][-1] == pytest.approx(exact * n / (facts["eval_steps"] * batch), rel=1e-4)
