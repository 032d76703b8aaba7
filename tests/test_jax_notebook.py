"""The JAX example notebook is valid, and its code runs on 8 CPU devices from a folder of images it builds into a
dataset, so it cannot rot: train, one exact evaluation pass, an Orbax checkpoint of model and input, a resume."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, write_images
from notebooks import code_cells, notebook_code

from shard_utils.format.manifest import load

NOTEBOOK = REPO / "examples" / "jax_tpu.ipynb"


def test_notebook_is_valid_stored_without_outputs_and_installs_the_wheel():
    install = [line for c in code_cells(NOTEBOOK) for line in c.splitlines() if line.startswith("!pip install")]
    assert install == ["!pip install -q --no-deps /kaggle/input/tpu-shards-wheel/tpu_shards-*.whl"]
    assert '"outputs": []' in NOTEBOOK.read_text() and '"execution_count": null' in NOTEBOOK.read_text()


@pytest.mark.jax
@pytest.mark.slow
def test_notebook_builds_trains_evaluates_once_and_resumes_on_eight_devices(tmp_path):
    write_images(tmp_path / "images", {"cat": 20, "dog": 20, "fish": 20}, size=(40, 30))
    script = tmp_path / "notebook.py"
    script.write_text(notebook_code(NOTEBOOK))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "2", "TPU_SHARDS_IMAGES": str(tmp_path / "images"),
           "TPU_SHARDS_DATASET": str(tmp_path / "ds"), "TPU_SHARDS_BATCH_PER_DEVICE": "2", "TPU_SHARDS_STEPS": "6",
           "TPU_SHARDS_IMAGE_SIZE": "16", "TPU_SHARDS_CHECKPOINTS": str(tmp_path / "checkpoints")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    validation = load(str(tmp_path / "ds")).num_records("validation")
    assert "8 cpu devices in 1 process(es), global batch 16" in out
    assert "3 classes: ['cat', 'dog', 'fish']; shards: tfrecord + array_record" in out
    assert "step 6: loss" in out  # 6 steps of 16: two epochs of the 48 or so training records
    assert "'image': ((16, 16, 16, 3), 'float32')" in out and "'label': ((16,), 'int32')" in out
    assert "images sharded P('data',)" in out
    assert f"validation accuracy over exactly {validation} records ({math.ceil(validation / 16)} batches)" in out
    resumed = re.search(r"resumed at step 3, trained to step 6: largest difference from the uninterrupted run's "
                        r"parameters (\S+)", out)
    assert resumed and float(resumed.group(1)) < 1e-6, out
    assert (tmp_path / "checkpoints" / "3").is_dir()
