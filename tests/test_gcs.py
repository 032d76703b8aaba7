"""gs:// input and output against a real GCS-compatible server (gcp-storage-emulator) on loopback.

Nothing here mocks a storage client: the job's own google-cloud-storage calls, Beam's gcsio and
`tpu-shards verify` all talk HTTP to the emulator, sometimes through a proxy that injects faults.
"""
from __future__ import annotations

import contextlib
import io
import re
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import google_crc32c
import pytest
import readers
from conftest import faults, run_cli, run_job, write_images
from gcs_fixtures import DENIED, FaultProxy, storage_host
from readers import shard_bytes

from beam_jobs.cli import main as cli_main
from shard_utils import storage
from shard_utils.format.manifest import load
from shard_utils.storage import _gcs as storage_gcs
from shard_utils.storage import base as storage_base

OPTS = ("--num-cores", "2", "--splits", "train=0.75,validation=0.25", "--image-size", "24")
SHARD = re.compile(r"^(train|validation)-\d{5}-of-\d{5}\.tfrecord$")


def dataset_files(em, uri: str) -> dict[str, bytes]:
    """Every object of a gs:// dataset, by name relative to it."""
    bucket, prefix = storage.split_gcs(uri.rstrip("/") + "/")
    return em.objects(bucket, prefix)


def assert_same_dataset(gs_manifest, local_manifest) -> None:
    assert gs_manifest.splits == local_manifest.splits  # counts, sizes, crc32c and sha256 of every shard
    assert gs_manifest.labels == local_manifest.labels
    assert (gs_manifest.rejected, gs_manifest.skipped, gs_manifest.files_seen) == (
        local_manifest.rejected, local_manifest.skipped, local_manifest.files_seen)


def assert_same_shards(em, uri: str, local) -> None:
    files = dataset_files(em, uri)
    assert {n: b for n, b in files.items() if SHARD.match(n)} == shard_bytes(local)
    assert files["rejected.jsonl"] == (local / "rejected.jsonl").read_bytes()
    # Published and tidy: only the dataset, no temporary objects left behind.
    assert sorted(n for n in files if not SHARD.match(n)) == sorted(readers.dataset_files(("train", "validation")))


def pages(proxy: FaultProxy) -> list[str]:
    """The object-listing requests the proxy saw."""
    return [p for m, p in proxy.requests if m == "GET" and re.search(r"/b/[^/]+/o\?", p)]


@pytest.fixture(scope="module")
def source(tmp_path_factory, gcs):
    """The same small image folder locally and in a bucket, and a local build of it."""
    base = tmp_path_factory.mktemp("gcs_source")
    root = base / "images"
    write_images(root, {"cat": 7, "dog": 6, "fish": 5}, size=(40, 30))
    (root / "dog" / "broken.jpg").write_bytes(b"this is not a JPEG")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    bucket = gcs.new_bucket("raw")
    uploaded = gcs.upload_tree(root, bucket, "photos")
    local = base / "local_out"
    with contextlib.redirect_stdout(io.StringIO()):
        local_manifest = run_job(root, local, *OPTS)
    return SimpleNamespace(root=root, bucket=bucket, uri=f"gs://{bucket}/photos", uploaded=uploaded,
                           local=local, manifest=local_manifest)


@pytest.fixture(scope="module")
def built(gcs, source):
    """A bucket-to-bucket build of the source, listing four objects per page to exercise paging (on one
    worker: with more, the walk runs in a worker process, which this process's page size does not reach)."""
    out = f"gs://{gcs.new_bucket('shards')}/datasets/v1"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed), \
            FaultProxy(gcs.url, paginate=True) as proxy, storage_host(proxy.url):
        mp.setattr(storage_base, "LIST_PAGE_SIZE", 4)
        m = run_job(source.uri, out, *OPTS, "--workers", "1")
    return SimpleNamespace(uri=out, manifest=m, stdout=printed.getvalue(), pages=pages(proxy))


def test_bucket_to_bucket_build_is_identical_to_local_build(gcs, source, built):
    assert source.uploaded == 20
    assert built.manifest.location == built.uri
    assert built.manifest.input == source.uri
    assert_same_dataset(built.manifest, source.manifest)
    assert built.manifest.num_records("train") + built.manifest.num_records("validation") == 18
    assert built.manifest.rejected["by_reason"] and built.manifest.skipped["count"] == 1
    assert_same_shards(gcs, built.uri, source.local)
    assert load(built.uri).splits == built.manifest.splits  # the manifest on the bucket is the one returned
    # The input was listed level by level, in parallel: the top level (the preflight's one page, which also
    # looks for split folders, then the job's), then each label folder in its two pages of 4 entries.
    walked = [p for p in built.pages if f"/b/{source.bucket}/" in p]
    assert all("maxResults=4" in p for p in walked)
    assert sum("delimiter" not in p for p in walked) == 0
    levels = sorted(re.search(r"prefix=([^&]*)", p).group(1) for p in walked if "delimiter" in p)
    assert levels == ["photos%2F"] * 2 + [f"photos%2F{label}%2F" for label in ("cat", "dog", "fish") for _ in "12"]


def test_manifest_crc32c_is_what_gcs_reports(gcs, built):
    bucket, prefix = storage.split_gcs(built.uri + "/")
    shards = [s for split in built.manifest.splits.values() for s in split.shards]
    assert len(shards) == 4
    for shard in shards:
        blob = gcs.blob(bucket, prefix + shard.path)
        assert blob.crc32c == shard.crc32c  # exactly the base64 big-endian string of the object metadata
        assert blob.size == shard.num_bytes
        data = blob.download_as_bytes()
        assert storage.crc32c_base64(google_crc32c.value(data)) == shard.crc32c
        assert storage.checksum(built.uri + "/" + shard.path) == (shard.num_bytes, shard.crc32c)


def test_local_run_prints_beam_counters(built):
    m = built.manifest
    line = next(text for text in built.stdout.splitlines() if text.strip().startswith("counters:"))
    counters = dict((k, int(v)) for k, v in (item.strip().rsplit(" ", 1) for item in line.split(":", 1)[1].split(", ")))
    total = sum(s.num_records for s in m.splits.values())
    assert counters["files_matched"] == m.files_seen == 20
    assert counters["images_written"] == total == 18
    assert counters["shards_written"] == 4
    assert counters["bytes_written"] == sum(s.num_bytes for s in m.splits.values())
    rejected = {k.removeprefix("rejected_"): v for k, v in counters.items() if k.startswith("rejected_")}
    assert rejected == m.rejected["by_reason"]


def test_verify_compares_metadata_without_downloading(gcs, built):
    with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        assert cli_main(["verify", built.uri]) == 0
        shallow = list(proxy.requests)
        assert cli_main(["verify", built.uri + "/manifest.json", "--deep"]) == 0
        deep = proxy.requests[len(shallow):]

    def downloads(requests):
        small = ("manifest.json", ".index.avro", "rejected.jsonl", "quality.jsonl", "croissant.json")  # read by both
        return [p for _, p in requests if "alt=media" in p and not any(name in p for name in small)]

    assert shallow and not downloads(shallow)  # shards' sizes and crc32c come from object metadata
    assert len(downloads(deep)) == 4  # --deep reads every shard


def test_verify_reports_each_problem_in_one_line(gcs, built, capsys):
    bucket, prefix = storage.split_gcs(built.uri + "/")
    copy = gcs.new_bucket("tampered")
    for name, data in dataset_files(gcs, built.uri).items():
        gcs.client.bucket(copy).blob("ds/" + name).upload_from_string(data)
    uri = f"gs://{copy}/ds"
    train0, train1 = [s.path for s in built.manifest.splits["train"].shards]
    validation0 = built.manifest.splits["validation"].shards[0].path
    blob = gcs.client.bucket(copy).blob("ds/" + train0)
    data = bytearray(blob.download_as_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    blob.upload_from_string(bytes(data))
    gcs.client.bucket(copy).blob("ds/" + validation0).delete()
    gcs.client.bucket(copy).blob("ds/" + train1).upload_from_string(b"short")
    capsys.readouterr()

    assert cli_main(["verify", uri]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"tpu-shards: {train0}: crc32c ") and "manifest says" in lines[0]
    stated = built.manifest.splits["train"].shards[1].num_bytes
    assert lines[1] == f"tpu-shards: {train1}: size 5 bytes, manifest says {stated}"
    assert lines[2].startswith(f"tpu-shards: {train1}: crc32c ")
    assert lines[3] == f"tpu-shards: {validation0}: missing"

    gcs.client.bucket(copy).blob("ds/manifest.json").delete()
    assert cli_main(["verify", uri]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("tpu-shards: no readable manifest at gs://")


def test_overwrite_on_a_bucket_behaves_as_locally(gcs, source, capsys):
    bucket = gcs.new_bucket("again")
    out = f"gs://{bucket}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(source.uri, out, *OPTS)
    first = dataset_files(gcs, out)
    assert sum(1 for n in first if SHARD.match(n)) == 4

    capsys.readouterr()
    assert cli_main(["build", "--input", source.uri, "--output", out, *OPTS]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tpu-shards: error: output {out} is not empty; pass --overwrite to replace the dataset there"
    assert dataset_files(gcs, out) == first  # refused before touching anything

    # An interrupted run left temporary objects; --overwrite clears them and the stale shards.
    gcs.client.bucket(bucket).blob("ds/.tpu-shards-tmp/19990101T000000-deadbeef/fragments/x.records") \
        .upload_from_string(b"leftover")
    gcs.client.bucket(bucket).blob("ds/unrelated.txt").upload_from_string(b"kept")
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(source.uri, out, *OPTS[2:], "--num-cores", "1", "--overwrite")
    names = sorted(dataset_files(gcs, out))
    assert names == sorted(["train-00000-of-00001.tfrecord", "unrelated.txt", "validation-00000-of-00001.tfrecord",
                            *readers.dataset_files(("train", "validation"))])
    assert m.num_records("train") + m.num_records("validation") == 18
    assert cli_main(["verify", out]) == 0


def test_transient_faults_are_retried_and_do_not_change_the_output(gcs, source):
    out = f"gs://{gcs.new_bucket('faulty')}/ds"
    with FaultProxy(gcs.url, rate=0.12, seed=7) as proxy, storage_host(proxy.url), \
            contextlib.redirect_stdout(io.StringIO()):
        m = run_job(source.uri, out, *OPTS)
    assert proxy.counts["503"] >= 1 and proxy.counts["429"] >= 1 and proxy.counts["reset"] >= 1, proxy.counts
    assert_same_dataset(m, source.manifest)
    assert_same_shards(gcs, out, source.local)


class BurstOf429(FaultProxy):
    """Answers 429 to the first two of every three GETs of each object of one bucket: every read of it (the
    size sample's and the encode step's) is refused twice, then served."""

    def __init__(self, upstream: str, bucket: str):
        super().__init__(upstream)
        self.bucket, self.gets = bucket, Counter()

    def _fault(self, method: str, path: str, byte_range: str | None = None) -> str | None:
        name = path.split("?")[0]
        if method == "GET" and "alt=media" in path and f"/b/{self.bucket}/o/" in name:
            with self.lock:
                self.gets[name] += 1
                if self.gets[name] % 3:
                    self.counts["429"] += 1
                    return "429"
        return super()._fault(method, path, byte_range)


@pytest.mark.slow
def test_a_burst_of_429s_on_reads_is_ridden_out_and_the_shards_are_the_same(gcs, source, monkeypatch):
    """Each read refused twice: retried per object under the process's throttle (made fresh here, with short
    holds), none fails its run, the encode step counts the retries and the throttled time, and the shards
    are those of the unthrottled local build."""
    from dataclasses import replace

    from shard_utils.storage import _gcs as _storage_gcs
    from shard_utils.storage.throttle import Throttle

    monkeypatch.setattr(_storage_gcs, "READ_THROTTLE", Throttle(delay_s=0.1))
    # Backoff from 0.25 s: an object's two waits, one after the other, are U(0, 0.25) + U(0, 0.5) s, so the 19
    # objects wait about 7 s in all (well over the counter's whole second: below it lies 8 standard deviations
    # away), read one after another on one worker.
    monkeypatch.setattr(_storage_gcs, "READ_POLICY", replace(_storage_gcs.READ_POLICY, initial_s=0.25, budget_s=60.0))
    out = f"gs://{gcs.new_bucket('burst')}/ds"
    printed = io.StringIO()
    with BurstOf429(gcs.url, source.bucket) as proxy, storage_host(proxy.url), contextlib.redirect_stdout(printed):
        m = run_job(source.uri, out, *OPTS, "--workers", "1")
    assert_same_dataset(m, source.manifest)
    assert_same_shards(gcs, out, source.local)
    line = next(text for text in printed.getvalue().splitlines() if text.strip().startswith("counters:"))
    counters = dict((k, int(v)) for k, v in (item.strip().rsplit(" ", 1) for item in line.split(":", 1)[1].split(", ")))
    read = m.files_seen - m.skipped["count"]  # the .DS_Store is skipped unread
    assert counters["source_reads_retried"] == 2 * read == 38
    assert counters["cumulativeThrottlingSeconds"] >= 1
    assert proxy.counts["429"] == 2 * sum(n // 3 for n in proxy.gets.values())  # every read served on its 3rd try


def test_two_worker_processes_read_the_bucket_and_write_the_same_bytes(gcs, source):
    out = f"gs://{gcs.new_bucket('multi')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(source.uri, out, *OPTS, "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert_same_dataset(m, source.manifest)
    assert_same_shards(gcs, out, source.local)


def test_listing_streams_page_by_page(gcs, monkeypatch):
    bucket = gcs.new_bucket("many")
    b = gcs.client.bucket(bucket)
    names = [f"in/{label}/{i:03d}.jpg" for label in ("a", "b") for i in range(11)] + ["in/a/sub/deep.jpg"]
    for n in names:
        b.blob(n).upload_from_string(n.encode())
    b.blob("in/b/").upload_from_string(b"")  # a "folder" placeholder object, as the console makes
    b.blob("input-elsewhere/x.jpg").upload_from_string(b"not under the prefix")
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 5)
    with FaultProxy(gcs.url, paginate=True) as proxy, storage_host(proxy.url):
        walk = storage.walk(f"gs://{bucket}/in")
        assert pages(proxy) == []  # nothing is listed before the first entry is asked for
        first = next(walk)
        after_first = len(pages(proxy))
        rest = list(walk)
    entries = [first, *rest]
    assert after_first == 1  # the first object arrives after one page, not after the whole listing
    assert len(pages(proxy)) == 5  # 24 objects, 5 a page
    assert [e.rel_path for e in entries] == sorted(n.removeprefix("in/") for n in names)
    assert all(e.size == len(("in/" + e.rel_path).encode()) and e.reason is None for e in entries)
    assert storage.top_level_dirs(f"gs://{bucket}/in/") == ["a", "b"]
    assert storage.list_names(f"gs://{bucket}/in/a") == [f"{i:03d}.jpg" for i in range(11)] + ["sub/"]
    assert storage.list_names(f"gs://{bucket}") == ["in/", "input-elsewhere/"]


def test_bad_buckets_give_one_line_errors(gcs, source, capsys):
    good_out = gcs.new_bucket("dest")
    empty = gcs.new_bucket("empty")
    cases = [
        (["--input", "gs://no-such-bucket-here/photos", "--output", f"gs://{good_out}/a"],
         "cannot list input gs://no-such-bucket-here/photos: bucket gs://no-such-bucket-here does not exist"),
        (["--input", source.uri, "--output", "gs://no-such-output-bucket/ds"],
         "cannot list output gs://no-such-output-bucket/ds: bucket gs://no-such-output-bucket does not exist"),
        (["--input", f"gs://{empty}/nothing", "--output", f"gs://{good_out}/b"],
         f"input gs://{empty}/nothing holds no objects"),
        (["--input", source.uri, "--output", source.uri + "/out"],
         f"output {source.uri}/out is inside the input {source.uri}; choose another place"),
        (["--input", "gs://", "--output", f"gs://{good_out}/c"], "input: 'gs://' is not a gs://bucket/path URI"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert cli_main(["build", *args]) == 2, args
        captured = capsys.readouterr()
        assert captured.err.strip() == f"tpu-shards: error: {message}"
    assert gcs.names(good_out) == []


def test_unwritable_output_bucket_is_refused_before_any_work(gcs, source, capsys):
    bucket = gcs.new_bucket("readonly")
    with FaultProxy(gcs.url, deny_writes_to=bucket) as proxy, storage_host(proxy.url):
        capsys.readouterr()
        code = cli_main(["build", "--input", source.uri, "--output", f"gs://{bucket}/ds", *OPTS])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (f"tpu-shards: error: output gs://{bucket}/ds is not writable: "
                   f"permission denied on gs://{bucket} (403): {DENIED}")
    assert proxy.counts["403"] >= 1
    assert gcs.names(bucket) == []


def test_cli_builds_and_verifies_a_bucket_without_printing_credentials(gcs, source):
    out = f"gs://{gcs.new_bucket('cli')}/ds"
    built = run_cli("build", "--input", source.uri, "--output", out, *OPTS)
    assert built.returncode == 0, built.stderr[-2000:]
    assert f"tpu-shards: wrote {out}" in built.stdout and "counters: files_matched 20" in built.stdout
    checked = run_cli("verify", out)
    assert checked.returncode == 0 and checked.stderr.strip() == ""
    assert checked.stdout.strip().startswith(f"tpu-shards: {out} is intact: train ")
    assert "MB; sizes and checksums checked" in checked.stdout
    missing = run_cli("build", "--input", "gs://no-such-bucket-here/x", "--output", out + "2")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "tpu-shards: error: cannot list input gs://no-such-bucket-here/x: "
        "bucket gs://no-such-bucket-here does not exist"]
    everything = built.stdout + built.stderr + checked.stdout + checked.stderr + missing.stderr
    for secret in gcs.tokens.secrets():
        assert secret not in everything
    assert_same_shards(gcs, out, source.local)


@pytest.mark.parametrize("stage", ["write", "publish-before-manifest"])  # every stage: tests/test_crash.py
def test_a_killed_build_on_a_bucket_leaves_no_partial_dataset_and_a_rerun_completes(gcs, source, stage):
    out = f"gs://{gcs.new_bucket('killed')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):  # the dataset the killed build overwrites: built in-process
        run_job(source.uri, out, *OPTS[2:], "--num-cores", "1")
    old = dataset_files(gcs, out)
    killed = run_cli("build", "--input", source.uri, "--output", out, *OPTS, "--overwrite",
                     env=faults(kill=stage))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    after = dataset_files(gcs, out)
    if "manifest.json" in after:  # then it is the previous dataset, whole and untouched
        assert {n: b for n, b in after.items() if not n.startswith(".")} == old
        assert cli_main(["verify", out]) == 0
    rerun = run_cli("build", "--input", source.uri, "--output", out, *OPTS, "--overwrite")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert_same_shards(gcs, out, source.local)  # -of-00001 shards of the first build are gone too
    assert cli_main(["verify", out]) == 0


def test_a_split_too_small_on_a_bucket_is_one_line_and_leaves_nothing(gcs, source, capsys):
    bucket = gcs.new_bucket("small")
    capsys.readouterr()
    code = cli_main(["build", "--input", source.uri, "--output", f"gs://{bucket}/ds", "--num-cores", "32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("tpu-shards: error: split 'train': 18 records cannot fill 32 shards")
    assert err[0].endswith("/report/rejected.jsonl")  # the source has a broken file: its reason is kept
    # No shard, no manifest, no lock; of the run's temporary objects only the report it names is left.
    assert [n.rsplit("/", 1)[-1] for n in gcs.names(bucket)] == ["rejected.jsonl", "skipped.jsonl"]


def test_a_bucket_build_reads_each_source_once_and_little_of_its_runs_back(gcs, tmp_path):
    """Bucket to bucket, runs in many small parts (as 128 MB shards of 16 MB parts are at scale): every source
    object is downloaded once (the listing's small size sample aside), and writing the shards downloads at
    most a quarter of their bytes again (copied shards, and the part a prefix ends in)."""
    import urllib.parse

    from beam_jobs.pipeline.plan_runs import SAMPLE_SIZE

    write_images(tmp_path / "in", {"a": 80, "b": 80}, size=(64, 48))
    raw = gcs.new_bucket("rawreads")
    assert gcs.upload_tree(tmp_path / "in", raw, "in") == 160
    out = f"gs://{gcs.new_bucket('reads')}/ds"
    with contextlib.redirect_stdout(io.StringIO()), FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        m = run_job(f"gs://{raw}/in", out, "--workers", "1", "--num-shards", "16", "--num-cores", "8",
                    "--run-part-mb", "0.004")
    gets = [(urllib.parse.unquote(p), n) for method, p, n in proxy.served if method == "GET" and "alt=media" in p]
    sources = [p for p, _ in gets if f"/b/{raw}/" in p]
    assert len(set(sources)) == 160 and len(sources) <= 160 + SAMPLE_SIZE
    read_back = sum(n for p, n in gets if "/runs/" in p and ".records" in p)  # records, not their metadata
    written = m.splits["train"].num_bytes
    assert 0 < read_back <= 0.25 * written, (read_back, written)
    metadata_reads = Counter(p.split("?")[0] for p, _ in gets if p.split("?")[0].endswith(".meta"))
    assert max(metadata_reads.values()) <= 3  # by its prefix shard and the copies of its tail


def test_an_object_that_stays_unavailable_fails_the_build_naming_it_and_publishes_nothing(gcs, source, monkeypatch,
                                                                                          capsys):
    """A read that still fails after its object's retries (503s past its budget) is not a rejection: the
    build fails, naming the object, and nothing is published; with 10 % of requests failing at random the
    same build completes (test_transient_faults_are_retried_and_do_not_change_the_output)."""
    from dataclasses import replace

    from shard_utils.storage import _gcs as _storage_gcs

    monkeypatch.setattr(_storage_gcs, "READ_POLICY", replace(_storage_gcs.READ_POLICY, initial_s=0.1, budget_s=2.0))
    out = f"gs://{gcs.new_bucket('unavailable')}/ds"
    capsys.readouterr()
    with FaultProxy(gcs.url, fail_paths=r"/photos/dog/img0002\.jpg") as proxy, storage_host(proxy.url):
        code = cli_main(["build", "--input", source.uri, "--output", out, *OPTS, "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tpu-shards: error: cannot read {source.uri}/dog/img0002.jpg: 503 ")
    # retried on its own, then given up
    assert re.search(r"\(failed (?:[2-9]|\d\d+) tries over \d+ s\)$", err[0]), err[0]
    assert proxy.counts["503"] > 1  # retried before giving up
    bucket, prefix = storage.split_gcs(out)
    assert gcs.names(bucket) == []  # no shard, no manifest, no lock, no temporary object


def put_objects(em, bucket: str, prefix: str, n: int) -> None:
    """n one-byte objects prefix/0000... (uploaded several at once)."""
    b = em.client.bucket(bucket)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: b.blob(f"{prefix}/{i:04d}").upload_from_string(b"x"), range(n)))


def most_at_once(timeline) -> int:
    """The most requests of a timeline (start, end, ...) in flight at one moment."""
    events = sorted([(t[0], 1) for t in timeline] + [(t[1], -1) for t in timeline])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.slow
def test_deleting_a_folder_sends_its_batches_at_once_and_leaves_the_rest(gcs):
    bucket = gcs.new_bucket("clean")
    put_objects(gcs, bucket, "tmp/run", 400)
    put_objects(gcs, bucket, "tmpx", 2)  # beside the folder, not in it
    with FaultProxy(gcs.url, latency=0.2) as proxy, storage_host(proxy.url):
        storage.delete_prefix(f"gs://{bucket}/tmp")
    assert gcs.names(bucket) == ["tmpx/0000", "tmpx/0001"]
    batches = [t for t in proxy.timeline if t[3].startswith("/batch/")]
    assert len(batches) == 4 and not [p for m, p in proxy.requests if m == "DELETE"]  # 100 a batch, none left
    assert 3 <= most_at_once(batches) <= storage_gcs.DELETE_BATCHES_IN_FLIGHT


@pytest.mark.slow
def test_the_objects_of_a_failed_batch_are_deleted_one_by_one(gcs):
    bucket = gcs.new_bucket("clean")
    put_objects(gcs, bucket, "tmp/run", 200)
    with FaultProxy(gcs.url, fail_paths=r"^/batch/", fail_first=1) as proxy, storage_host(proxy.url):
        storage.delete_prefix(f"gs://{bucket}/tmp")
    assert gcs.names(bucket) == []
    assert proxy.failed_paths == 1  # one of the two batches answered 503
    assert len([p for m, p in proxy.requests if m == "DELETE"]) == 100  # its objects, by the final pass
