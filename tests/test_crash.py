"""Crash safety: SIGKILL at named stages never leaves a manifest beside missing or partial shards,
and a rerun with --overwrite is byte-identical to an uninterrupted run."""
import contextlib
import io
import shutil
import signal

import pytest
from conftest import faults, run_cli, run_job, write_images
from readers import shard_bytes

from shard_utils.read.verify import verify

DATASET_FILES = ["manifest.json", "rejected.jsonl", "quality.jsonl", "train.index.avro", "dataset_info.json",
                 "features.json", "image.class.label.labels.txt", "croissant.json", "README.md"]
STAGES = ["encode", "write", "publish-start", "publish-old-removed", "publish-renaming", "publish-before-manifest"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Old and new inputs, the old dataset built once (each test works on a copy), and the new reference."""
    base = tmp_path_factory.mktemp("crash")
    write_images(base / "old", {"a": 20, "b": 20})
    write_images(base / "new", {"a": 14, "b": 13, "c": 9}, seed=7)
    reference = base / "reference"
    rebuild(base / "new", reference)
    rebuild(base / "old", base / "old_built", "--num-shards", "16")
    return base, shard_bytes(reference)


def rebuild(source, out, *extra: str) -> None:
    """A build that is not killed, in this process: the job a CLI run would start, without its start-up."""
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(source, out, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_kill_at_stage_then_rerun(inputs, tmp_path, stage):
    base, expected = inputs
    out = tmp_path / "out"
    shutil.copytree(base / "old_built", out)
    old = shard_bytes(out)
    killed = run_cli("build", "--input", base / "new", "--output", out, "--overwrite",
                     env=faults(kill=stage))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if (out / "manifest.json").exists():
        assert verify(str(out), deep=True) == []  # the previous complete dataset, untouched
        assert shard_bytes(out) == old
    rebuild(base / "new", out, "--overwrite")
    assert shard_bytes(out) == expected
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, *DATASET_FILES])
    assert verify(str(out)) == []


@pytest.mark.slow
def test_a_killed_first_build_leaves_only_bookkeeping_that_a_rerun_cleans(inputs, tmp_path):
    """Killed before publishing, a first build leaves only its lock and temporary folder: a rerun needs no
    --overwrite, takes over the dead run's lock and removes its temporary data."""
    base, expected = inputs
    out = tmp_path / "out"
    killed = run_cli("build", "--input", base / "new", "--output", out, env=faults(kill="write"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.iterdir()) == [".tpu-shards-lock.json", ".tpu-shards-tmp"]
    rebuild(base / "new", out)
    assert shard_bytes(out) == expected
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, *DATASET_FILES])


@pytest.mark.slow
def test_a_rerun_removes_the_temporary_files_a_killed_write_left_beside_the_dataset(inputs, tmp_path):
    """A kill between a local write and its rename leaves `.<name>.<8 characters>.tmp` beside the file (the lock
    renewed at that moment, the manifest being written): the next run into the output removes them, and only
    them."""
    base, expected = inputs
    out = tmp_path / "out"
    shutil.copytree(base / "old_built", out)
    leftovers = ["..tpu-shards-lock.json.k3j4h5g6.tmp", ".manifest.json.a1b2c3d4.tmp",
                 ".train-00000-of-00008.tfrecord.zz9y8x7w.tmp"]
    for name in leftovers:
        (out / name).write_bytes(b"half written")
    (out / ".notes.txt.abcdefgh.tmp").write_text("not ours: stays")
    rebuild(base / "new", out, "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, *DATASET_FILES, ".notes.txt.abcdefgh.tmp"])


@pytest.mark.slow
def test_an_append_that_finds_nothing_new_removes_what_a_killed_append_left(inputs, tmp_path):
    """A killed append can leave its new index and a temporary file; a rerun with nothing new to add leaves the
    dataset exactly as its manifest names it."""
    base, _ = inputs
    out = tmp_path / "out"
    shutil.copytree(base / "old_built", out)
    before = sorted(p.name for p in out.iterdir())
    (out / "train.g001.index.avro").write_bytes(b"an index of a generation never published")
    (out / ".manifest.json.q1w2e3r4.tmp").write_bytes(b"half written")
    again = run_cli("build", "--append", "--input", base / "old", "--output", out, "--num-shards", "16")
    assert again.returncode == 0, again.stderr
    assert "nothing to append" in again.stdout
    assert sorted(p.name for p in out.iterdir()) == before
