"""ArrayRecord shards bucket to bucket on the storage emulator: the same objects as a local build, verified
there, and a build killed mid-upload leaves no partial object and a rerun gives the same dataset. Grain reads the
shards in the bucket where they are, with the requests docs/random-access.md states."""
from __future__ import annotations

import contextlib
import io
import random
import re
import signal
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader
from array_record_requests import shard_gets
from conftest import faults, run_cli, run_job, write_images
from gcs_fixtures import FaultProxy, storage_host

from beam_jobs.cli import main as cli_main
from shard_utils import storage
from shard_utils.format import array_record
from shard_utils.format.manifest import load
from shard_utils.read.array_record_source import array_record_source, shard_slices
from shard_utils.read.random_access import Decoder, RandomAccessSource
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


# ---------------------------------------------------------------------------- Grain reading shards in the bucket

@pytest.fixture(scope="module")
def in_bucket(gcs, source):
    """The `both` dataset built by the job straight into a bucket, and its manifest there."""
    out = f"gs://{gcs.new_bucket('argrain')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(source.uri, out, *OPTS, "--format", "both", "--workers", "1")
    return SimpleNamespace(uri=out, manifest=load(out))


def every_position(n: int) -> list[int]:
    positions = list(range(n))
    random.Random(3).shuffle(positions)
    return positions


@pytest.mark.slow
def test_grain_reads_array_record_shards_in_the_bucket_in_place(gcs, source, in_bucket, tmp_path, monkeypatch):
    grain = pytest.importorskip("grain")
    local = load(str(source.local["both"]))
    watched = tmp_path / "tmp"
    watched.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(watched))  # where a download to a temporary file would go
    for expression in ("train", "validation", "train[1:]+validation[:50%]"):
        remote = array_record_source(in_bucket.manifest, expression)
        assert isinstance(remote, grain.sources.ArrayRecordDataSource)
        indexed = RandomAccessSource(local, expression)
        decode = Decoder.for_manifest(local)
        with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
            positions = every_position(len(indexed))
            records = [remote[i] for i in positions]
        assert len(remote) == len(indexed) == in_bucket.manifest.num_records(expression)
        assert records == [indexed[i] for i in positions]  # the TFRecord twins' bytes, through the index
        for data, i in zip(records, positions, strict=True):
            got, expected = decode(data), decode(indexed[i])
            assert got["label"] == expected["label"] and got["source_id"] == expected["source_id"]
            assert np.array_equal(got["image"], expected["image"]) and got["image"].shape == (24, 24, 3)
        # Only array-record's own reads: its tail, then records from their offsets; a download (whole, or in
        # chunks of bytes=A-B as the Python client reads) would show here.
        gets = shard_gets(proxy)
        assert gets and all(re.fullmatch(r"bytes=(-1048576|\d+-)", r or "") for _, r in gets), gets
        assert len(gets) <= len(positions) + len(shard_slices(local, expression))  # an open per shard + a read each
        assert {n for n, _ in gets} <= {f"ds/{s.path}" for s in local.array_record_shards("train")
                                        + local.array_record_shards("validation")}
    assert list(watched.iterdir()) == []  # nothing copied down


@pytest.mark.slow
def test_requests_per_shard_open_and_per_random_read_on_gs(gcs, in_bucket):
    """The figures docs/random-access.md states, held as bounds: making a source reads nothing, a shard's first
    read opens it with one ranged GET of its tail, and every record read is one ranged GET."""
    grain = pytest.importorskip("grain")
    m = in_bucket.manifest
    shards = m.array_record_shards("train")
    with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        src = array_record_source(m, "train")
        assert shard_gets(proxy) == []  # the counts come from the manifest
        firsts = [sum(s.num_records for s in shards[:k]) for k in range(len(shards))]
        for first in firsts:  # first read of each shard: open + read
            before = len(proxy.requests)
            src[first]
            gets = shard_gets(proxy, before)
            assert len(gets) <= 2 and gets[0][1] == "bytes=-1048576"  # the footer: the shard's last 1 MiB
        before = len(proxy.requests)
        positions = every_position(len(src))
        for i in positions:  # every shard open: one request per record
            src[i]
        assert len(shard_gets(proxy, before)) <= len(positions)
        for batch in (positions[:6], [0, 1, 2]):  # Grain's batched read, adjacent records too: a request each
            before = len(proxy.requests)
            src.__getitems__(batch)
            assert len(shard_gets(proxy, before)) <= len(batch)
        before = len(proxy.requests)
        bare = grain.sources.ArrayRecordDataSource(m.array_record_paths("train"))  # counts by opening every shard
        assert len(bare) == len(src) and len(shard_gets(proxy, before)) == len(shards)


def test_the_proxy_answers_suffix_ranges_so_a_shard_over_1_mib_opens_in_one_request(gcs, tmp_path):
    """The emulator ignores `Range: bytes=-N` and sends the whole object, which array-record takes for its tail
    (and fails on, past 1 MiB); FaultProxy answers it as Cloud Storage does. A 503 on the open is retried."""
    records = [bytes([i]) * 65536 for i in range(24)]
    local = tmp_path / "big.array_record"
    array_record.write_shard(records, str(local))
    bucket = gcs.new_bucket("arbig")
    gcs.client.bucket(bucket).blob(local.name).upload_from_filename(str(local))
    with FaultProxy(gcs.url, fail_paths=r"big\.array_record", fail_first=1) as proxy, storage_host(proxy.url):
        reader = ArrayRecordReader(f"gs://{bucket}/{local.name}", "readahead_buffer_size:0")
        try:
            assert reader.num_records() == 24 and reader.read([17, 3]) == [records[17], records[3]]
        finally:
            reader.close()
    assert local.stat().st_size > 1 << 20
    assert [r for _, r in shard_gets(proxy)][:2] == ["bytes=-1048576", "bytes=-1048576"]  # failed once, retried
    assert proxy.counts["503"] == 1 and proxy.served[0][2] == 1 << 20  # the last 1 MiB, not the whole object


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
