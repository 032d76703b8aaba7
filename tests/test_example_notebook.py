"""The example TPU notebook is valid and its code runs on CPU against small local datasets, so it cannot rot.

It runs on 8 logical CPU devices, where the notebook picks MirroredStrategy: the same distributed input
path as TPUStrategy, for two epochs with validation after each (issue 9.6 stopped at epoch 2 there).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO
from notebooks import notebook_code
from synthetic import record, write_dataset

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("tensorflow")

from shard_utils.format import schema  # noqa: E402 - after the skips

NOTEBOOK = REPO / "examples" / "tpu_training.ipynb"
# Prepended to the notebook's code: logical devices must exist before TensorFlow initializes.
LOGICAL_DEVICES = """import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * {n})
"""


def run_notebook(tmp_path, dataset, devices: int, epochs: int, batch_per_replica: int) -> str:
    """Run the notebook's code in a subprocess; returns its stdout (asserting success)."""
    script = tmp_path / "notebook.py"
    script.write_text((LOGICAL_DEVICES.format(n=devices) if devices > 1 else "") + notebook_code(NOTEBOOK))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TPU_SHARDS_DATASET": str(dataset),
           "TPU_SHARDS_EPOCHS": str(epochs), "TPU_SHARDS_BATCH_PER_REPLICA": str(batch_per_replica),
           "TPU_SHARDS_MODEL": "tiny"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_notebook_is_valid_and_installs_from_the_repository():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    install = [line for c in code for line in c.splitlines() if line.startswith("!pip install")]
    # On no package index: the wheel built by the documented command, which works as written once uploaded as
    # the dataset it names; the Git alternative says where its URL comes from.
    assert install == ["!pip install -q --no-deps /kaggle/input/tpu-shards-wheel/tpu_shards-*.whl"]
    assert "python -m pip wheel --no-deps -w dist ." in code[0] and "`tpu-shards-wheel`" in code[0]
    assert "OWNER" not in code[0] and "`git remote get-url origin`" in code[0]
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code")  # stored without outputs


@pytest.mark.slow
def test_notebook_trains_two_epochs_on_eight_devices(small_dataset, tmp_path):
    out = run_notebook(tmp_path, small_dataset, devices=8, epochs=2, batch_per_replica=2)
    assert "using MirroredStrategy over 8 devices" in out and "MirroredStrategy with 8 replicas" in out
    assert "3 classes: ['cat', 'dog', 'fish']\n" in out
    assert "global batch 16: 3 steps/epoch, 2 validation steps" in out
    assert "Epoch 2/2" in out and len(re.findall(r"val_accuracy: [0-9.]+", out)) == 2
    assert "validation accuracy over exactly 17 records" in out
    assert "'image': ((8, 32, 32, 3), 'float32')" in out


@pytest.mark.slow
def test_notebook_trains_on_a_multi_label_dataset(tmp_path):
    """Multi-hot labels switch the notebook to per-class sigmoids; the stored label offset is invisible."""
    labels = ["cat", "dog", "fish"]
    items = {split: [record(i, (i % 3,) if i % 2 else (i % 3, (i + 1) % 3), labels, offset=1, multi_label=True)
                     for i in range(start, start + count)] for split, start, count in (("train", 0, 16),
                                                                                       ("validation", 100, 6))}
    features = schema.feature_table(multi_label=True, max_lengths={schema.LABEL: 2, schema.LABEL_TEXT: 2})
    write_dataset(tmp_path / "d", items, labels, features, label_offset=1, multi_label=True, image_size=[12, 16])
    out = run_notebook(tmp_path, tmp_path / "d", devices=1, epochs=2, batch_per_replica=4)
    assert "using the default strategy" in out
    assert "3 classes: ['cat', 'dog', 'fish'] (multi-label)" in out
    assert "global batch 4: 4 steps/epoch, 2 validation steps" in out and "Epoch 2/2" in out
    assert "validation accuracy over exactly 6 records" in out
    assert "'label': ((8, 3), 'float32')" in out and "'image': ((8, 12, 16, 3), 'float32')" in out
