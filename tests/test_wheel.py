"""The documented offline install (issue 9.8): a wheel built with `python -m pip wheel --no-deps -w dist .`,
installed with --no-deps into a folder, gives a loader that imports and reads a dataset with TensorFlow alone."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO
from synthetic import record, write_dataset

from shard_utils import __version__, schema

pytest.importorskip("tensorflow")

BUILD_COMMAND = ["-m", "pip", "wheel", "--no-deps", "-w", "dist", "."]  # as the README and notebook give it
CHECK = """
import sys
from shard_utils import loader
batch = next(iter(loader.make_dataset(sys.argv[1], "train", 2, training=False, as_dict=True, repeat=False)))
print(loader.__file__)
print(sorted(batch), batch["label"].numpy().tolist())
print([m for m in ("apache_beam", "google.cloud.storage") if m in sys.modules])
"""


def run(args: list[str], cwd, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_wheel_built_by_the_documented_command_installs_a_working_loader(tmp_path):
    source = tmp_path / "checkout"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    run(BUILD_COMMAND, cwd=source)
    [wheel] = list((source / "dist").glob("*.whl"))
    assert wheel.name == f"tpu_shards-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "shard_utils/loader.py" in names and "shard_utils/loader_decode.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)

    target = tmp_path / "site"
    run(["-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], cwd=tmp_path)
    items = {"train": [record(i, (i % 2,), ["a", "b"], offset=1) for i in range(4)]}
    write_dataset(tmp_path / "data", items, ["a", "b"], schema.feature_table(), label_offset=1, image_size=[12, 16])
    # Only the installed copy is on the path (not the checkout): TensorFlow comes from this venv.
    out = run(["-c", CHECK, str(tmp_path / "data")], cwd=tmp_path, env={"PYTHONPATH": str(target)}).stdout
    file, keys, leaked = out.strip().splitlines()[-3:]
    assert file == str(target / "shard_utils" / "loader.py")
    assert keys == "['image', 'label', 'source_id', 'weight'] [0, 1]"
    assert leaked == "[]"
