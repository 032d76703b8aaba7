"""tpu-shards reshard on the real runner: the same records (same bytes) balanced for another topology."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, photo, run_cli, run_job, write_images
from test_dataflow import dataflow_args, read_gs

from beam_jobs.jobs.reshard import run as reshard
from shard_utils import storage
from shard_utils.format.manifest import load
from shard_utils.format.tfrecord import iter_records
from shard_utils.read.random_access import RandomAccessSource
from shard_utils.read.verify import verify

OPTS = ("--image-size", "24",)


def serialized(out: str | Path) -> dict[str, list[bytes]]:
    """Every split's records as serialized bytes, sorted: the dataset as a multiset of records."""
    m = load(str(out))
    found = {}
    for name, split in m.splits.items():
        found[name] = sorted(r for s in split.shards for r in iter_records(io.BytesIO(
            storage.read_bytes(storage.join(m.location, s.path)))))
    return found


def shard_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord"))}


def quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A dataset for 8 cores x 1 host (40 good images, a broken one, a hidden and a non-media file)."""
    base = tmp_path_factory.mktemp("reshard")
    root = base / "images"
    write_images(root, {"cat": 20, "dog": 20}, size=(40, 30))
    (root / "dog" / "broken.jpg").write_bytes(b"not a JPEG")
    (root / "cat" / "notes.txt").write_text("a note")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    out = base / "src"
    m = quiet(run_job, root, out, "--num-cores", "8", *OPTS)
    assert [len(s.shards) for s in m.splits.values()] == [8]
    return SimpleNamespace(base=base, root=root, out=out, manifest=m)


@pytest.fixture(scope="module")
def resharded(source):
    dst = source.base / "dst"
    m = quiet(reshard, [str(source.out), str(dst), "--num-cores", "8", "--num-hosts", "4"])
    return SimpleNamespace(dst=dst, manifest=m)


@pytest.mark.slow
def test_reshard_8x1_to_8x4_keeps_every_record_byte_for_byte_with_the_new_balance(source, resharded):
    m, dst = resharded.manifest, resharded.dst
    assert serialized(dst) == serialized(source.out)
    assert (m.num_cores, m.num_hosts) == (8, 4)
    for split in m.splits.values():
        sizes = [s.num_records for s in split.shards]
        assert len(sizes) == 32 and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert verify(str(dst), deep=True) == []
    src = RandomAccessSource(str(dst), "train")
    assert len(src) == m.splits["train"].num_records and isinstance(src[len(src) - 1], bytes)


def test_labels_features_and_accounting_are_carried_over(source, resharded):
    old, new = source.manifest, resharded.manifest
    assert (new.labels, new.features, new.image_size, new.label_offset) == (
        old.labels, old.features, old.image_size, old.label_offset)
    assert (new.files_seen, new.rejected, new.skipped) == (old.files_seen, old.rejected, old.skipped)
    assert new.rejected["count"] == 1 and new.skipped["by_reason"] == {"hidden": 1, "not_media": 1}
    for name in ("rejected.jsonl", "skipped.jsonl"):
        assert (resharded.dst / name).read_bytes() == (source.out / name).read_bytes()
    for name, split in new.splits.items():
        assert split.class_counts == old.splits[name].class_counts
    assert new.options["resharded_from"]["location"] == str(source.out) and new.options["num_hosts"] == 4


@pytest.mark.slow
def test_reshard_gives_the_records_and_balance_a_build_for_that_topology_gives(source, resharded):
    """The same records, byte for byte, in shards of the same counts as a build for that topology (which
    records share a shard differs: a build cuts its runs from the listing, before anything is encoded)."""
    direct = source.base / "direct"
    built = quiet(run_job, source.root, direct, "--num-cores", "8", "--num-hosts", "4", *OPTS)
    again = load(str(resharded.dst))
    for name, split in built.splits.items():
        assert sorted(s.num_records for s in again.splits[name].shards) == sorted(s.num_records for s in split.shards)
        assert records_of(resharded.dst, name) == records_of(direct, name)


def records_of(out: Path, split: str) -> list[bytes]:
    """Every framed record of a split, sorted."""
    return sorted(r for p in sorted(out.glob(f"{split}-*.tfrecord")) for r in iter_records(p.open("rb")))


def test_a_dataset_without_an_index_is_resharded_from_its_records(source, resharded, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    text = json.loads((source.out / "manifest.json").read_text())
    for split in text["splits"].values():
        split.pop("index")
    (old / "manifest.json").write_text(json.dumps(text))
    for shard in source.out.glob("*.tfrecord"):
        (old / shard.name).write_bytes(shard.read_bytes())
    (old / "rejected.jsonl").write_bytes((source.out / "rejected.jsonl").read_bytes())
    (old / "skipped.jsonl").write_bytes((source.out / "skipped.jsonl").read_bytes())
    dst = tmp_path / "dst"
    quiet(reshard, [str(old), str(dst), "--num-hosts", "4"])
    assert shard_files(dst) == shard_files(resharded.dst)
    assert verify(str(dst), deep=True) == []


@pytest.mark.slow
def test_too_few_records_for_the_new_topology_names_what_a_reshard_can_change(source, tmp_path):
    """40 records cannot fill 8 x 8 shards: the line names the reshard's options, not the build's --splits."""
    dst = tmp_path / "dst"
    done = run_cli("reshard", source.out, dst, "--num-cores", "8", "--num-hosts", "8")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "40 records cannot fill 64 shards" in lines[0] and "lower --num-cores/--num-hosts" in lines[0], lines
    assert "--splits" not in lines[0] and not dst.exists()


@pytest.mark.slow
def test_a_damaged_shard_fails_with_one_line_naming_it(source, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in source.out.iterdir():
        if path.is_file():
            (broken / path.name).write_bytes(path.read_bytes())
    shard = broken / "train-00003-of-00008.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    dst = tmp_path / "dst"
    done = run_cli("reshard", broken, dst, "--num-hosts", "4")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpu-shards: error: source {broken} is damaged: "
                                                   "train-00003-of-00008.tfrecord: ")
    assert "nothing was written" in lines[0]
    assert not dst.exists()


@pytest.mark.slow
def test_an_appended_dataset_reshards_into_one_generation_with_its_label_ids(tmp_path):
    root = tmp_path / "images"
    write_images(root, {"cat": 5, "dog": 5}, size=(40, 30))
    out = tmp_path / "out"
    quiet(run_job, root, out, "--num-cores", "2")
    (root / "ant").mkdir()
    for i in range(4):
        photo(40, 30, 900 + i).save(root / "ant" / f"a{i}.jpg", "JPEG")
    grown = quiet(run_job, root, out, "--num-cores", "2", "--append")
    assert grown.labels == ["cat", "dog", "ant"]
    dst = tmp_path / "dst"
    m = quiet(reshard, [str(out), str(dst), "--num-cores", "4"])
    assert m.labels == ["cat", "dog", "ant"] and m.generations is None
    assert serialized(dst) == serialized(out) and len(m.splits["train"].shards) == 4
    assert m.files_seen == grown.files_seen == 14 and verify(str(dst), deep=True) == []


def test_reshard_bucket_to_bucket(gcs, source, resharded):
    bucket = gcs.new_bucket("reshard")
    gcs.upload_tree(source.out, bucket, "src")
    dst = f"gs://{bucket}/dst"
    m = quiet(reshard, [f"gs://{bucket}/src", dst, "--num-hosts", "4"])
    assert m.splits == resharded.manifest.splits
    assert verify(dst, deep=True) == []
    written = gcs.objects(bucket, "dst/")
    assert {n: b for n, b in written.items() if n.endswith(".tfrecord")} == shard_files(resharded.dst)


def test_reshard_dataflow_template_is_built_offline(gcs, source, tmp_path):
    bucket, tmp = gcs.new_bucket("reshard-src"), gcs.new_bucket("reshard-tmp")
    gcs.upload_tree(source.out, bucket, "src")
    template = tmp_path / "template.json"
    done = subprocess.run(
        [sys.executable, "-m", "beam_jobs.jobs.reshard", f"gs://{bucket}/src", f"gs://{bucket}/dst", "--num-hosts", "4",
         *dataflow_args(tmp, str(template))], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tpu-shards: Dataflow template written to {template}" in done.stdout
    assert gcs.names(bucket, "dst") == []  # no job ran

    from apache_beam.portability.api import beam_runner_api_pb2

    options = json.loads(template.read_text())["environment"]["sdkPipelineOptions"]["options"]
    pipeline = beam_runner_api_pb2.Pipeline.FromString(read_gs(gcs, options["pipelineUrl"]))
    names = {t.unique_name for t in pipeline.components.transforms.values()}
    assert {"ListShards", "CopyRecords", "CarryOver", "PlanShards", "WriteShards", "Publish",
            "CopyRecords/Copy", "Publish/Move", "Publish/Commit"} <= names


def test_a_reshard_writes_croissant_json_and_the_card(resharded):
    from described import assert_described

    m = assert_described(resharded.dst)
    assert (m.num_cores, m.num_hosts) == (8, 4)
