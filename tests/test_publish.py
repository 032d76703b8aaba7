"""Publishing without Beam: order of visibility, retries after a partial publish, stale files, the lock."""
from __future__ import annotations

import json
import random
import threading
from collections import Counter

import pytest

from beam_jobs import publish
from beam_jobs.errors import UsageError
from beam_jobs.run import claim, reports
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.failure import failure_message
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.tally import Tally
from benchmarks.scale_sim import reports as scale_reports
from shard_utils import storage
from shard_utils.errors import InternalError, PlanError
from shard_utils.format import index
from shard_utils.format.manifest import load
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.format.tfrecord import frame
from shard_utils.read.verify import verify
from shard_utils.sharding.run_plan import SplitLayout
from shard_utils.sharding.writer import ShardResult
from shard_utils.storage import lock as runlock


def make_run(tmp_path, n_shards=2, records=(3, 2)):
    """A config, a run holding the output's lock, and shards written under the run's temp folder."""
    out = tmp_path / "out"
    config = BuildConfig(input=str(tmp_path / "in"), output=str(out), temp_root=str(out / claim.TEMP_ROOT),
                         num_cores=1, run_id="r1", created="2026-01-01T00:00:00+00:00")
    run = RunInfo("r1", config.temp_dir("r1"), config.created)
    runlock.acquire(str(out), "r1", config.created)
    results, total = [], 0
    for i in range(n_shards):
        name = TFRECORD.shard_name("train", i, n_shards)
        framed = [frame(f"record {i}.{j}".encode()) for j in range(records[i])]
        data = b"".join(framed)
        temp = storage.join(run.temp_dir, "shards", name)
        storage.write_bytes(temp, data)
        d = storage.Digest()
        d.update(data)
        rows, offset = [], 0
        for j, f in enumerate(framed):
            rows.append(index.IndexRow(f"a/{i}.{j}.jpg", i, offset, len(f), 0, (0,), "0" * 64, 1, 1))
            offset += len(f)
        part = storage.join(run.temp_dir, "index", name + ".avro")
        with storage.open_write(part) as out:
            index.write_index(out, rows, index.index_schema())
        results.append(ShardResult("train", i, temp, name, records[i], d.size, d.crc32c, d.sha256,
                                           ((0, records[i]),), part))
        total += records[i]
    plans = {"train": SplitLayout("train", total, 0, n_shards, n_shards)}
    tally = Tally(seen=total + 1)
    rejected = [{"source": "a/bad.jpg", "reason": "corrupt", "message": "broken"}]
    return config, run, results, plans, tally, rejected


def finish(config, run, results, plans, tally, rejected, **kw):
    return publish.finish(results, config, plans=[plans], failure=[], rejected=rejected, skipped_files=[],
                          tally=tally, labels=["a"], run=run, **kw)


def test_publish_moves_shards_writes_reports_and_manifest_and_tidies(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    out = tmp_path / "out"
    (out / "train-00000-of-00004.tfrecord").write_bytes(b"stale shard of an earlier build")
    finish(config, run, results, plans, tally, rejected)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "croissant.json", "dataset_info.json", "features.json", "image.class.label.labels.txt",
        "manifest.json", "rejected.jsonl",
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "train.index.avro"]
    m = load(str(out))
    assert m.splits["train"].index.num_rows == 5
    assert m.files_seen == 6 and m.rejected["count"] == 1 and m.splits["train"].class_counts == {"a": 5}
    assert json.loads((out / "rejected.jsonl").read_text())["source"] == "a/bad.jpg"
    assert not storage.exists(runlock.lock_path(str(out)))  # the lock is given back


def test_a_publish_retried_after_moving_some_shards_completes(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    out = tmp_path / "out"
    first = results[0]
    storage.rename(first.temp_path, str(out / first.name))  # the first attempt died after one rename
    finish(config, run, results, plans, tally, rejected)
    m = load(str(out))
    assert [s.path for s in m.splits["train"].shards] == [r.name for r in results]
    assert (out / first.name).stat().st_size == first.num_bytes


def test_accounting_that_does_not_close_is_an_internal_error_and_publishes_nothing(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    tally.seen += 5
    with pytest.raises(InternalError, match="accounting does not close"):
        finish(config, run, results, plans, tally, rejected)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_missing_shard_is_an_internal_error(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    with pytest.raises(InternalError, match="expected 2 shards, got 1"):
        finish(config, run, results[:1], plans, tally, rejected)


def test_too_many_rejects_fail_with_reasons_and_reports(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    from dataclasses import replace

    from beam_jobs.run.config import RejectLimit

    strict = replace(config, max_rejected=RejectLimit(count=0))
    with pytest.raises(PlanError) as err:
        finish(strict, run, results, plans, tally, rejected)
    message = str(err.value)
    assert "1 of 6 files were rejected, more than --max-rejected 0" in message
    assert "1 corrupt (e.g. a/bad.jpg: broken)" in message
    report = storage.join(run.temp_dir, "report", "rejected.jsonl")
    assert report in message and json.loads(storage.read_bytes(report))["reason"] == "corrupt"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_planning_failure_names_the_top_reasons(tmp_path):
    config, run, results, plans, tally, _ = make_run(tmp_path)
    rejected = [{"source": f"img{i:03d}.jpg", "reason": "no_label", "message": "file sits directly in the input folder"}
                for i in range(96)] + [{"source": "x/l.jpg", "reason": "symlink", "message": "dangling"}]
    with pytest.raises(PlanError) as err:
        publish.finish([], config, plans=[], failure=["no input file could be used (0 records)"], rejected=rejected,
                       skipped_files=[], tally=Tally(seen=97), labels=[], run=run)
    assert str(err.value).startswith("no input file could be used (0 records); rejected: 96 no_label (e.g. "
                                     "img000.jpg: file sits directly in the input folder), 1 symlink")


def test_a_run_that_lost_its_lock_publishes_nothing(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    out = str(tmp_path / "out")
    runlock.release(out, "r1")
    runlock.acquire(out, "r2", "later")
    with pytest.raises(UsageError, match="lost its lock"):
        finish(config, run, results, plans, tally, rejected)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_output_content_ignores_the_jobs_own_bookkeeping(tmp_path):
    out = tmp_path / "out"
    (out / claim.TEMP_ROOT / "old-run").mkdir(parents=True)
    runlock.acquire(str(out), "r", "now")
    assert claim.output_content(str(out)) == []
    (out / "notes.txt").write_text("mine")
    assert claim.output_content(str(out)) == ["notes.txt"]


def test_temp_data_follows_temp_location_on_the_same_kind_of_storage():
    assert claim.temp_root_for("gs://b/out", None) == "gs://b/out/.tpu-shards-tmp"
    root = claim.temp_root_for("gs://b/out", "gs://tmp-bucket/dataflow")
    assert root.startswith("gs://tmp-bucket/dataflow/tpu-shards/") and root != claim.temp_root_for(
        "gs://b/other", "gs://tmp-bucket/dataflow")
    assert claim.temp_root_for("/data/out", "gs://tmp/x") == "/data/out/.tpu-shards-tmp"


def publication(tmp_path):
    config, run, results, plans, tally, rejected = make_run(tmp_path)
    pub = publish.plan_publication(results, config, plans=[plans], failure=[], rejected=rejected, skipped_files=[],
                                   tally=tally, labels=["a"], run=run)
    return config, pub


def dataset_bytes(out) -> dict[str, bytes]:
    """Every file of a dataset (its own folder's name replaced, so datasets in two folders compare)."""
    root = str(out.parent).encode()
    return {p.name: p.read_bytes().replace(root, b"ROOT") for p in sorted(out.iterdir()) if p.is_file()}


def test_every_publishing_step_run_twice_gives_the_same_dataset(tmp_path):
    """Dataflow runs every step at least once: each step is repeated here, and the run published again after
    it succeeded; nothing fails and the bytes are those of a single run."""
    config, pub = publication(tmp_path / "once")
    publish.publish_here(pub, config)
    once = dataset_bytes(tmp_path / "once" / "out")

    config, pub = publication(tmp_path / "twice")
    for _ in range(2):
        publish.clear_output(pub, config)
    for move in pub.moves:
        publish.move_shard(move, config)
        publish.move_shard(move, config)
    indexes = [publish.merge_index(job, config, pub.run) for job in pub.indexes for _ in range(2)]
    assert indexes[0] == indexes[1]
    publish.commit(pub, config, dict(indexes))
    publish.commit(pub, config, dict(indexes))
    publish.publish_here(pub, config)  # every step once more, after the run has published and let go
    out = tmp_path / "twice" / "out"
    assert dataset_bytes(out) == once
    assert sorted(p.name for p in out.iterdir()) == sorted(once)  # no temporary folder, no lock left
    assert verify(str(out)) == []  # sizes and checksums (its records are not Examples)


def test_two_attempts_at_publishing_at_once_both_succeed_with_the_same_dataset(tmp_path):
    config, pub = publication(tmp_path / "once")
    publish.publish_here(pub, config)
    once = dataset_bytes(tmp_path / "once" / "out")

    config, pub = publication(tmp_path / "both")
    barrier = threading.Barrier(2)
    errors = []

    def attempt():
        try:
            barrier.wait()
            publish.clear_output(pub, config)
            barrier.wait()
            for move in pub.moves:
                publish.move_shard(move, config)
            barrier.wait()
            indexes = dict(publish.merge_index(job, config, pub.run) for job in pub.indexes)
            barrier.wait()
            publish.commit(pub, config, indexes)
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert dataset_bytes(tmp_path / "both" / "out") == once


def shuffled_rejects(n: int, seed: int = 3) -> list[dict]:
    """n rejects in no order: some sources rejected for two reasons, some (source, reason) twice with two messages."""
    rng = random.Random(seed)
    entries = [{"source": f"d{rng.randrange(40):02d}/img{i:05d}.jpg", "reason": rng.choice(("corrupt", "tiny")),
                "message": f"m{i % 3}"} for i in range(n)]
    entries += [{**e, "reason": "symlink"} for e in entries[:50]] + [{**e, "message": "again"} for e in entries[:20]]
    rng.shuffle(entries)
    return entries


def bundled_counts(entries: list[dict], size: int) -> reports.ReportCounts:
    """Counts made per bundle of `size` and merged, as a runner's combine does."""
    total = reports.ReportCounts()
    for i in range(0, len(entries), size):
        total.merge(reports.counted(entries[i:i + size]))
    return total


def test_a_report_written_in_range_pieces_is_the_one_sort_of_its_lines_whatever_the_bundles(tmp_path):
    entries = shuffled_rejects(3000)
    one_sort = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in sorted(
        entries, key=lambda e: (e["source"], e["reason"], json.dumps(e, ensure_ascii=False)))).encode()
    made = []
    for size in (7, 1000):
        counts = bundled_counts(entries, size)
        bounds = counts.bounds(piece_lines=400)
        pieces: dict[int, list] = {}
        for e in entries:
            pieces.setdefault(reports.piece_of(e, bounds), []).append(e)
        paths = tuple(reports.write_piece(str(tmp_path / f"b{size}"), "rejected", k, pieces[k]) for k in sorted(pieces))
        dst = str(tmp_path / f"rejected-{size}.jsonl")
        reports.write_report(reports.Report(counts.brief(), paths), dst, str(tmp_path / "scratch"))
        made.append((bounds, counts.brief(), storage.read_bytes(dst)))
        assert len(paths) == len(bounds) + 1 >= 6  # about 3,070 lines in pieces of about 400
        assert max(len(p) for p in pieces.values()) < 1000
    assert made[0] == made[1]  # the same ranges, counts and bytes whatever the bundling
    assert made[0][2] == one_sort
    counts = made[0][1]
    assert (counts.count, counts.by_reason) == (3070, Counter(e["reason"] for e in entries))
    tally = Tally(seen=4000)
    assert failure_message("why", reports.Report(counts), tally, "r") == failure_message(
        "why", entries, tally, "r")  # the failure line from the counts alone


@pytest.mark.slow
def test_the_publish_code_holds_no_more_for_a_million_rejects_than_for_a_hundred_thousand():
    """The report path the job runs (counts merged per bundle, pieces written one at a time, the plan's failure
    line and the composed report) over rejects streamed from a generator, each count in a process of its own."""
    small, large = (scale_reports.in_child(n) for n in (100_000, 1_000_000))
    assert (small["lines"], large["lines"], large["pieces"]) == (100_000, 1_000_000, 50)  # whole, sorted (checked)
    assert "1000000 of 1000000 files were rejected, more than --max-rejected 0" in large["message"]
    assert large["peak_rss_mb"] - small["peak_rss_mb"] < 25, (small, large)  # holding them all: about +500 MB


def test_an_appended_report_is_the_old_one_as_it_is_then_the_new_lines(tmp_path):
    new = [{"source": "b.jpg", "reason": "corrupt", "generation": 1}, {"source": "a.jpg", "reason": "tiny"}]
    piece = reports.write_piece(str(tmp_path / "run"), "rejected", 0, new)
    for old, joined in ((b'{"z": 1}\n', b'{"z": 1}\n'), (b'{"z": 1}', b'{"z": 1}\n'), (None, b"")):
        before = tmp_path / "old.jsonl"
        if old is not None:
            before.write_bytes(old)
        elif before.exists():
            before.unlink()
        report = reports.Report(reports.counted(new).brief(), (piece,), before=str(before))
        dst = str(tmp_path / "rejected.g001.jsonl")
        reports.write_report(report, dst, str(tmp_path / "scratch"))
        assert storage.read_bytes(dst) == joined + b'{"source": "a.jpg", "reason": "tiny"}\n' \
                                                   b'{"source": "b.jpg", "reason": "corrupt", "generation": 1}\n'
