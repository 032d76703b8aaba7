"""A run encoded in parts when a local build has more workers than runs: the parts' plan, their join into the
run's very bytes and checksums, and builds whose every file is the same on any worker count, killed or not."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import faults, install_faults, run_cli, run_job, write_images
from PIL import ImageFilter
from readers import rejected, shard_bytes
from test_quality import scene

from shard_utils import storage
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import RecordMeta
from shard_utils.sharding.encode_run import PARTS_FOLDER, EncodedRun, EncodeTally, RunTask, item_order
from shard_utils.sharding.run_parts import MIN_PART_ITEMS, join_parts, part_tasks, parts_per_run, remove_parts
from shard_utils.sharding.run_plan import SplitLayout
from shard_utils.sharding.runs import RunWriter

STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")  # when a build ran (manifest, README, croissant)


def layouts(*runs: tuple[str, int, int]) -> dict[str, SplitLayout]:
    return {split: SplitLayout(split, items, 0, num_runs, num_runs) for split, items, num_runs in runs}


def test_runs_are_cut_in_parts_only_when_they_are_fewer_than_the_workers():
    one = layouts(("train", 1000, 1))
    assert [parts_per_run(one, w, "train", 0) for w in (1, 2, 3, 16)] == [1, 2, 3, 16]
    eight = layouts(("train", 4000, 8))
    assert [parts_per_run(eight, w, "train", 0) for w in (4, 8, 16, 12)] == [1, 1, 2, 3]  # 24 parts on 12 workers
    both = layouts(("train", 3000, 3), ("validation", 100, 1))  # 4 runs, 6 workers: 12 parts in all
    assert parts_per_run(both, 6, "train", 2) == 3 and parts_per_run(both, 6, "validation", 0) == 3
    small = layouts(("train", 3 * MIN_PART_ITEMS + 1, 1))
    assert parts_per_run(small, 16, "train", 0) == 3 and parts_per_run(layouts(("t", 5, 1)), 16, "t", 0) == 1


def test_parts_are_the_run_s_items_in_key_order_cut_into_near_equal_contiguous_pieces():
    items = [MediaItem(f"/in/{i}.jpg", f"{i}.jpg", ("a",), 100) for i in range(23)]
    task = RunTask("train", 4, tuple(reversed(items)))
    parts = part_tasks(task, 3, seed=7)
    assert [p.part for p in parts] == [0, 1, 2] and {(p.split, p.run) for p in parts} == {("train", 4)}
    assert [len(p.items) for p in parts] == [8, 8, 7]
    assert [i for p in parts for i in p.items] == sorted(items, key=lambda i: item_order(i, 7))


def written(folder: str, records: list[bytes], part: int | None = None, first: int = 0):
    """A run (or part: under the parts folder) holding these records (the first is the run's `first`), written
    as encode_run writes one (on gs://, in parts of about 256 bytes)."""
    where = folder if part is None else storage.join(folder, PARTS_FOLDER, f"{part:03d}")
    writer = RunWriter(where, "train", 2, chunk_bytes=256)
    for i, framed in enumerate(records, first):
        writer.add(framed, RecordMeta(i, f"s{i}", len(framed), (i % 3,), "", 1, 1))
    return writer.close()


@pytest.mark.parametrize("where", ["local", pytest.param("gcs", marks=pytest.mark.gcs)])
def test_joined_parts_are_the_run_one_worker_writes_and_the_part_files_go(request, tmp_path, where):
    folder = str(tmp_path) if where == "local" else f"gs://{request.getfixturevalue('gcs').new_bucket('parts')}"
    data = [bytes([i]) * (50 + 37 * i) for i in range(11)]
    whole = written(storage.join(folder, "one"), data)
    cuts = [(0, 4), (4, 4), (4, 9), (9, 11)]  # an empty part (every item rejected) among them
    parts = []
    for n, (lo, hi) in enumerate(cuts):
        file = written(storage.join(folder, "parts"), data[lo:hi], part=n, first=lo)  # checksums from its start
        tally = EncodeTally(records=hi - lo, read_retries=n)
        parts.append(EncodedRun("train", 2, file, ({"source": f"bad{n}"},), tally, ({"finding": n},)))
    joined = join_parts(parts, storage.join(folder, "parts"), chunk_bytes=256)
    assert join_parts(parts, storage.join(folder, "parts"), chunk_bytes=256) == joined  # run again: the same
    assert joined.file is not None and (joined.file.count, joined.file.num_bytes) == (whole.count, whole.num_bytes)
    assert [size for _, size in joined.file.parts] == [size for _, size in whole.parts]  # gs://: the same chunks
    assert joined.file.read(0, joined.file.num_bytes) == whole.read(0, whole.num_bytes) == b"".join(data)
    assert joined.file.entries() == whole.entries()
    assert [r["source"] for r in joined.rejected] == ["bad0", "bad1", "bad2", "bad3"]
    assert joined.tally == EncodeTally(records=11, read_retries=6) and len(joined.quality) == 4
    remove_parts(parts)
    assert list(storage.walk(storage.join(folder, "parts", PARTS_FOLDER))) == []


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> SimpleNamespace:
    """Photos with an undecodable file and quality findings among them, and the tree a one-worker build of
    them on one core publishes (one run: every build with more workers encodes it in parts)."""
    base = tmp_path_factory.mktemp("parts")
    write_images(base / "in", {"a": 30, "b": 25})
    (base / "in" / "a" / "broken.jpg").write_bytes((base / "in" / "a" / "img0001.jpg").read_bytes()[:300])
    scene(1, (240, 180)).filter(ImageFilter.GaussianBlur(6)).save(base / "in" / "b" / "blurred.jpg", quality=90)
    reference, printed = build(base / "in", base / "reference" / "out", "--num-cores", "1", "--workers", "1")
    assert "run_parts_encoded" not in printed
    return SimpleNamespace(images=base / "in", reference=reference)


def build(images: Path, out: Path, *args: str) -> tuple[dict[str, str], str]:
    """A build in this process: the sha256 of every file it published (its time of day left out), its printout."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        run_job(images, out, *args)
    return tree(out), printed.getvalue()


def tree(out: Path) -> dict[str, str]:
    return digests({p.name: p.read_bytes() for p in out.iterdir()})


def digests(files: dict[str, bytes]) -> dict[str, str]:
    """The sha256 of each file, the time of day it was built left out."""
    return {name: hashlib.sha256(STAMP.sub(b"", data)).hexdigest() for name, data in sorted(files.items())}


def parts_encoded(printed: str) -> int:
    found = re.search(r"run_parts_encoded (\d+)", printed)
    return int(found.group(1)) if found else 0


@pytest.mark.slow
def test_a_build_checking_its_jpegs_by_their_markers_alone_keeps_its_runs_whole(source, tmp_path):
    """Joining parts reads, writes and hashes their bytes again: more than such a build spends on an image."""
    whole, printed = build(source.images, tmp_path / "w2" / "out", "--num-cores", "1", "--workers", "2",
                           "--validate", "structure")
    one, _ = build(source.images, tmp_path / "w1" / "out", "--num-cores", "1", "--workers", "1",
                   "--validate", "structure")
    assert parts_encoded(printed) == 0 and "runs_encoded 1" in printed and whole == one
    _, resized = build(source.images, tmp_path / "r2" / "out", "--num-cores", "1", "--workers", "2",
                       "--validate", "structure", "--image-size", "64")
    assert parts_encoded(resized) == 2  # re-encoded: its parts pay for their join


@pytest.mark.slow
def test_every_file_is_the_same_with_runs_in_parts_on_any_worker_count(source, tmp_path, monkeypatch):
    import beam_jobs.jobs.options

    monkeypatch.setattr(beam_jobs.jobs.options, "available_cores", lambda: 4)  # 3 workers on a 2-core machine
    trees, parts = {}, {}
    for cores, workers in ((1, 2), (1, 3), (2, 1), (2, 2), (2, 3)):
        trees[cores, workers], printed = build(source.images, tmp_path / f"{cores}-{workers}" / "out",
                                               "--num-cores", str(cores), "--workers", str(workers))
        parts[cores, workers] = parts_encoded(printed)
    assert trees[1, 2] == trees[1, 3] == source.reference
    assert trees[2, 1] == trees[2, 2] == trees[2, 3] and trees[2, 1]["rejected.jsonl"] == source.reference[
        "rejected.jsonl"]
    assert parts == {(1, 2): 2, (1, 3): 3, (2, 1): 0, (2, 2): 0, (2, 3): 6}  # 2 runs keep 2 workers busy
    out = tmp_path / "1-3" / "out"
    assert "corrupt" in (out / "rejected.jsonl").read_text() and "blur" in (out / "quality.jsonl").read_text()


@pytest.mark.slow
def test_a_part_whose_worker_the_system_killed_is_encoded_again_into_the_same_bytes(source, tmp_path, monkeypatch):
    install_faults(monkeypatch, oom="a/img0003.jpg:1")
    killed, printed = build(source.images, tmp_path / "out", "--num-cores", "1", "--workers", "2")
    assert killed == source.reference and parts_encoded(printed) == 2
    assert Path(os.environ["TPU_SHARDS_TEST_COUNTER"]).stat().st_size == 2  # its part killed once, then run alone


@pytest.mark.slow
def test_a_build_killed_before_joining_its_parts_gives_the_same_bytes_when_run_again(source, tmp_path):
    out = tmp_path / "out"
    args = ("--num-cores", "1", "--workers", "2")
    killed = run_cli("build", "--input", source.images, "--output", out, *args, env=faults(kill="join-parts"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert list((out / ".tpu-shards-tmp").rglob(f"{PARTS_FOLDER}/*/runs/train/*.records"))  # the parts it left
    again, _ = build(source.images, out, *args)
    assert again == source.reference  # the dead run's temporary folder (its parts) removed, nothing else left


@pytest.mark.gcs
@pytest.mark.slow
def test_a_bucket_build_in_parts_rides_out_transient_faults_and_publishes_the_same_files(gcs, source):
    """Parts and their join on gs:// (written, read back, removed) through a proxy that answers 503, 429 and
    resets: no file is rejected for them, and the files are those of the local one-worker build."""
    from gcs_fixtures import FaultProxy, storage_host

    bucket, out = gcs.new_bucket("parts-in"), gcs.new_bucket("parts-out")
    gcs.upload_tree(source.images, bucket, "photos")
    with FaultProxy(gcs.url, rate=0.12, seed=3) as proxy, storage_host(proxy.url), \
            contextlib.redirect_stdout(io.StringIO()) as printed:
        run_job(f"gs://{bucket}/photos", f"gs://{out}/ds", "--num-cores", "1", "--workers", "2")
    assert proxy.counts["503"] >= 1 and proxy.counts["429"] >= 1 and proxy.counts["reset"] >= 1, proxy.counts
    assert parts_encoded(printed.getvalue()) == 2
    published = digests(gcs.objects(out, "ds/"))
    assert sorted(published) == sorted(source.reference)  # nothing else left in the bucket: the parts are gone
    where = {"README.md", "croissant.json", "manifest.json"}  # these name the input and output
    assert {n: h for n, h in published.items() if n not in where} == {
        n: h for n, h in source.reference.items() if n not in where}


@pytest.mark.slow
def test_a_decoder_crash_in_a_part_costs_only_its_file(source, tmp_path, monkeypatch):
    """The part's items are tried one by one, the one that crashes is rejected and the part encoded again
    without it: the shards are those of a one-worker build where that file is merely undecodable."""
    crashed_id = "b/img0007.jpg"
    src = tmp_path / "in"
    shutil.copytree(source.images, src)
    whole = (src / crashed_id).read_bytes()
    (src / crashed_id).write_bytes(whole[:len(whole) // 2])  # truncated: rejected `corrupt`
    clean, _ = build(src, tmp_path / "clean" / "out", "--num-cores", "1", "--workers", "1")
    install_faults(monkeypatch, segv=crashed_id)
    crashed, printed = build(source.images, tmp_path / "crashed" / "out", "--num-cores", "1", "--workers", "2")
    assert parts_encoded(printed) == 2 and "rejected_corrupt 2" in printed
    assert rejected(tmp_path / "crashed" / "out") == rejected(tmp_path / "clean" / "out") == {
        "a/broken.jpg": "corrupt", crashed_id: "corrupt"}
    assert "SIGSEGV" in (tmp_path / "crashed" / "out" / "rejected.jsonl").read_text()
    assert shard_bytes(tmp_path / "crashed" / "out") == shard_bytes(tmp_path / "clean" / "out")
    assert crashed["train.index.avro"] == clean["train.index.avro"]
