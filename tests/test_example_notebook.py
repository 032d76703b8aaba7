"""The example TPU notebook is valid and its code runs on CPU against a small local dataset, so it cannot rot."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("tensorflow")

NOTEBOOK = REPO / "examples" / "tpu_training.ipynb"


def notebook_code() -> str:
    """The notebook's code cells as one script, without shell (`!`) and magic (`%`) lines."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    lines = [l for cell in cells for l in cell.splitlines() + [""] if not l.lstrip().startswith(("!", "%"))]
    return "\n".join(lines)


def test_notebook_is_valid_and_installs_the_package():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any("pip install" in c for c in code)
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code")  # stored without outputs


def test_notebook_trains_on_cpu(small_dataset, tmp_path):
    script = tmp_path / "notebook.py"
    script.write_text(notebook_code())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TPU_SHARDS_DATASET": str(small_dataset),
           "TPU_SHARDS_EPOCHS": "1", "TPU_SHARDS_BATCH_PER_REPLICA": "8", "TPU_SHARDS_MODEL": "tiny"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "using the default strategy" in proc.stdout
    assert "3 classes: ['cat', 'dog', 'fish']" in proc.stdout
    assert "global batch 8: 7 steps/epoch, 3 validation steps" in proc.stdout
    assert "validation accuracy over exactly 17 records" in proc.stdout
    assert "'image': ((8, 32, 32, 3), 'float32')" in proc.stdout
