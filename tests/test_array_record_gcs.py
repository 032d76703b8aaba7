"""ArrayRecord shards bucket to bucket on the storage emulator: the same objects as a local build, verified
there, and a build killed mid-upload leaves no partial object and a rerun gives the same dataset."""
from __future__ import annotations

import contextlib
import io
import signal
from types import SimpleNamespace

import pytest
from conftest import faults, run_cli, run_job, write_images

from beam_jobs.cli import main as cli_main
from shard_utils import storage
from shard_utils.format import array_record
from shard_utils.read.verify import verify

# Written from the manifest (its time, the output's name): compared through the manifest, not as bytes.
MADE_FROM_MANIFEST = ("manifest.json", "croissant.json", "README.md")

OPTS = ("--num-cores", "2", "--splits", "train=0.75,validation=0.25", "--image-size", "24")


def objects(em, uri: str) -> dict[str, bytes]:
    bucket, prefix = storage.split_gcs(uri.rstrip("/") + "/")
    return em.objects(bucket, prefix)


def local_files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def source(tmp_path_factory, gcs):
    base = tmp_path_factory.mktemp("ar_gcs")
    root = base / "images"
    write_images(root, {"cat": 7, "dog": 6, "fish": 5}, size=(40, 30))
    bucket = gcs.new_bucket("arraw")
    gcs.upload_tree(root, bucket, "photos")
    local = {}
    for fmt in ("both", "array_record"):
        with contextlib.redirect_stdout(io.StringIO()):
            run_job(root, base / fmt, *OPTS, "--format", fmt, "--workers", "1")
        local[fmt] = base / fmt
    return SimpleNamespace(uri=f"gs://{bucket}/photos", local=local)


def same_as_local(em, uri: str, local) -> None:
    """The bucket's dataset holds exactly the local build's shards and TFDS files, byte for byte, and nothing
    temporary."""
    found = objects(em, uri)
    expected = {n: b for n, b in local_files(local).items() if n not in MADE_FROM_MANIFEST}
    assert {n: b for n, b in found.items() if n not in MADE_FROM_MANIFEST} == expected


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["both", "array_record"])
def test_bucket_to_bucket_is_the_local_build(gcs, source, fmt):
    out = f"gs://{gcs.new_bucket('arout')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(source.uri, out, *OPTS, "--format", fmt, "--workers", "1")
    same_as_local(gcs, out, source.local[fmt])
    assert m.formats == (("tfrecord", "array_record") if fmt == "both" else ("array_record",))
    assert verify(out) == [] and verify(out, deep=True) == []
    twins = [s for split in m.splits.values() for s in (split.array_record_shards or split.shards)]
    for twin in twins:  # what GCS reports is what the manifest says
        assert storage.checksum(f"{out}/{twin.path}") == (twin.num_bytes, twin.crc32c)
    shard = m.array_record_paths("train")[0]
    assert list(array_record.read_records(shard)) == list(array_record.read_records(
        str(source.local[fmt] / m.array_record_shards("train")[0].path)))


@pytest.mark.slow
def test_verify_on_a_bucket_finds_a_replaced_twin(gcs, source):
    out = f"gs://{gcs.new_bucket('arbad')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(source.uri, out, *OPTS, "--format", "both", "--workers", "1")
    twin = m.splits["train"].array_record_shards[0]
    storage.write_bytes(f"{out}/{twin.path}", b"not an ArrayRecord file")
    assert any(twin.path in p and "size" in p for p in verify(out))
    assert any(twin.path in p for p in verify(out, deep=True))
    assert cli_main(["verify", out]) == 1


@pytest.mark.slow
def test_a_build_killed_mid_upload_leaves_no_partial_object_and_a_rerun_is_identical(gcs, source):
    out = f"gs://{gcs.new_bucket('arkill')}/ds"
    first = run_cli("build", "--input", source.uri, "--output", out, *OPTS, "--format", "both")
    assert first.returncode == 0, first.stderr[-2000:]
    old = {n: b for n, b in objects(gcs, out).items() if not n.startswith(".")}
    killed = run_cli("build", "--input", source.uri, "--output", out, *OPTS, "--format", "both", "--overwrite",
                     "--seed", "1", env=faults(kill="array-record-upload"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    after = objects(gcs, out)
    assert {n: b for n, b in after.items() if not n.startswith(".")} == old  # the old dataset, whole
    assert cli_main(["verify", out, "--deep"]) == 0
    for name in (n for n in after if n.endswith(".array_record")):  # temporary ones too: each one whole
        assert array_record.count_records(f"{out}/{name}") > 0
    rerun = run_cli("build", "--input", source.uri, "--output", out, *OPTS, "--format", "both", "--overwrite")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    same_as_local(gcs, out, source.local["both"])


@pytest.mark.slow
def test_verify_deep_killed_on_a_bucket_leaves_no_scratch_copy(gcs, source, tmp_path):
    """verify --deep reads a gs:// ArrayRecord shard from a local copy: a file with no name, so a SIGKILL leaves
    nothing in TMPDIR (a named copy of each shard was left there)."""
    out = f"gs://{gcs.new_bucket('arscratch')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(source.uri, out, *OPTS, "--format", "array_record", "--workers", "1")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    killed = run_cli("verify", out, "--deep", env={**faults(kill="verify-array-record-read"), "TMPDIR": str(scratch)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert list(scratch.iterdir()) == []
    assert cli_main(["verify", out, "--deep"]) == 0
