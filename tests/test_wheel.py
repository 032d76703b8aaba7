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

from shard_utils import __version__
from shard_utils.format import schema

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


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the folder it is installed in with --no-deps), built by the documented command."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "checkout"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    run(BUILD_COMMAND, cwd=source)
    [wheel] = list((source / "dist").glob("*.whl"))
    target = tmp_path / "site"
    run(["-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], cwd=tmp_path)
    return wheel, target


@pytest.mark.slow
def test_wheel_built_by_the_documented_command_installs_a_working_loader(installed, tmp_path):
    wheel, target = installed
    assert wheel.name == f"tpu_shards-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "shard_utils/loader.py" in names and "shard_utils/read/decode.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)

    items = {"train": [record(i, (i % 2,), ["a", "b"], offset=1) for i in range(4)]}
    write_dataset(tmp_path / "data", items, ["a", "b"], schema.feature_table(), label_offset=1, image_size=[12, 16])
    # Only the installed copy is on the path (not the checkout): TensorFlow comes from this venv.
    out = run(["-c", CHECK, str(tmp_path / "data")], cwd=tmp_path, env={"PYTHONPATH": str(target)}).stdout
    file, keys, leaked = out.strip().splitlines()[-3:]
    assert file == str(target / "shard_utils" / "loader.py")
    assert keys == "['image', 'label', 'source_id', 'weight'] [0, 1]"
    assert leaked == "[]"


@pytest.mark.slow
def test_install_hints_name_what_pip_can_install_here(installed, tmp_path):
    """tpu-shards is on no package index: an installed wheel's hints name the extra's own packages, a
    checkout's `pip install -e` on the checkout (`.` from inside it)."""
    hints = "from shard_utils.extras import install_hint; print(install_hint('report', 'matplotlib'))"
    wheel_hint = run(["-c", hints], cwd=tmp_path, env={"PYTHONPATH": str(installed[1])}).stdout
    assert wheel_hint == "pip install 'matplotlib>=3.8'\n"
    assert run(["-c", hints], cwd=REPO).stdout == 'pip install -e ".[report]"\n'
    elsewhere = run(["-c", hints], cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert elsewhere.stdout == f'pip install -e "{REPO}[report]"\n'


NOTEBOOK_READERS = """
import sys
from shard_utils import manifest, tfds_meta
print(sorted(tfds_meta.tfds_files(manifest.load(sys.argv[1]))))
try:
    import shard_utils.random_access
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.slow
def test_readers_of_a_no_deps_install_without_google_crc32c(installed, tmp_path):
    """A --no-deps install where only TensorFlow's own packages exist (no google-crc32c, fastavro, Beam or the GCS
    client): the TFDS metadata is made all the same; random access says in one line which packages it needs."""
    from base_install import environment

    items = {"train": [record(i, (i % 2,), ["a", "b"]) for i in range(4)]}
    write_dataset(tmp_path / "data", items, ["a", "b"], schema.feature_table(), image_size=[12, 16])
    env = environment(tmp_path / "blocker", {"google_crc32c", "fastavro", "apache_beam", "google.cloud", "tqdm"})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "blocker"), str(installed[1])])
    out = run(["-c", NOTEBOOK_READERS, str(tmp_path / "data")], cwd=tmp_path, env=env).stdout.splitlines()
    assert out == ["['dataset_info.json', 'features.json', 'image.class.label.labels.txt']",
                   "MissingExtra shard_utils.random_access needs google_crc32c and fastavro, which are not installed: "
                   "pip install google_crc32c fastavro"]
