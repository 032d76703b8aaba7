"""The encode step's local worker pool: results for every item, crashes isolated to one item, no orphans."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import write_images

from beam_jobs.local_pool import LocalPool
from shard_utils.encode import EncodeSettings, Encoded, encode_batch, encode_item, reject
from shard_utils.inputs import MediaItem

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def helpers_on_path(monkeypatch):
    """Worker processes import test helpers by name: put the tests folder on their PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def test_every_batch_comes_back_and_a_crash_costs_only_its_item(helpers_on_path):
    pool = LocalPool(2)
    try:
        batches = [[i * 10 + j for j in range(5)] for i in range(12)]
        batches[4].insert(2, "segv")  # this worker dies mid-batch: the batch is retried item by item
        for batch in batches:
            pool.submit("pool_helpers.square_or_crash", batch, 0.0, on_crash=lambda item, why: ("crashed", item, why))
        got = [x for result in pool.drain() for x in result]
    finally:
        pool.close()
    numbers = sorted(x for x in got if isinstance(x, int))
    assert numbers == sorted((i * 10 + j) ** 2 for i in range(12) for j in range(5))
    assert [x for x in got if isinstance(x, tuple)] == [
        ("crashed", "segv", "the decoder crashed the worker process (SIGSEGV)")]


def test_pool_results_are_the_inline_results(tmp_path):
    write_images(tmp_path / "in", {"a": 6, "b": 6})
    items = [MediaItem(f"{p.parent.name}/{p.name}", str(p), p.stat().st_size, (p.parent.name,))
             for p in sorted((tmp_path / "in").rglob("*.jpg"))]
    settings = EncodeSettings(label_ids={"a": 0, "b": 1})
    pool = LocalPool(2)
    try:
        for start in range(0, len(items), 5):
            pool.submit("shard_utils.encode.encode_batch", items[start:start + 5], settings,
                        on_crash=lambda item, why: reject(item, "corrupt", why))
        pooled = sorted((x for r in pool.drain() for x in r), key=lambda e: e.meta.source_id)
    finally:
        pool.close()
    inline = sorted(encode_batch(items, settings), key=lambda e: e.meta.source_id)
    assert all(isinstance(e, Encoded) for e in pooled)
    assert [(e.framed, e.split, e.meta) for e in pooled] == [(e.framed, e.split, e.meta) for e in inline]


def test_workers_stay_out_of_ctrl_c_and_stop_when_told(helpers_on_path):
    pool = LocalPool(2)
    pids = pool.pids()
    assert all(os.getpgid(pid) != os.getpgid(0) for pid in pids)  # a terminal's Ctrl-C does not reach them
    for i in range(2):
        pool.submit("pool_helpers.square_or_crash", [i], 5.0)
    assert sorted(x for r in pool.drain() for x in r) == [0, 1]  # both workers are up
    pool.submit("pool_helpers.square_or_crash", ["slow"], 5.0)
    for pid in pids:
        os.kill(pid, signal.SIGINT)  # even sent to them directly, Ctrl-C is the parent's to handle
    time.sleep(0.5)
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    pool.kill()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def test_a_missing_file_is_a_reject_not_a_crash(tmp_path):
    item = MediaItem("a/gone.jpg", str(tmp_path / "gone.jpg"), 0, ("a",), origin="train.csv line 3")
    out = encode_item(item, EncodeSettings(label_ids={"a": 0}))
    assert out == {"source": "a/gone.jpg", "reason": "missing",
                   "message": f"train.csv line 3: {tmp_path / 'gone.jpg'} does not exist"}


def test_a_crash_in_work_that_cannot_be_isolated_is_an_error(helpers_on_path):
    pool = LocalPool(1)
    try:
        pool.submit("pool_helpers.square_or_crash", ["segv"], 0.0)  # no on_crash: e.g. a shard write
        with pytest.raises(RuntimeError, match="SIGSEGV"):
            list(pool.drain())
    finally:
        pool.close()


def released_numbers(results) -> tuple[list[int], list]:
    """(the numbers in the files release_kept wrote, every other result)."""
    import json

    numbers, other = [], []
    for result in results:
        for x in result:
            if isinstance(x, str) and x.endswith(".json"):
                numbers.extend(json.loads(Path(x).read_text()))
            else:
                other.append(x)
    return sorted(numbers), other


def test_kept_work_is_released_exactly_once(helpers_on_path, tmp_path):
    pool = LocalPool(2)
    try:
        for i in range(12):
            pool.submit("pool_helpers.keep_or_crash", [i * 10 + j for j in range(5)], keeps=True)
        numbers, counts = released_numbers([*pool.drain(), *pool.release_all("pool_helpers.release_kept",
                                                                              str(tmp_path))])
    finally:
        pool.close()
    assert numbers == sorted(i * 10 + j for i in range(12) for j in range(5))
    assert counts == [5] * 12
    assert 1 <= len(list(tmp_path.iterdir())) <= 2  # one file per worker that held something


def test_kept_work_lost_with_its_worker_is_replayed_and_counted_once(helpers_on_path, tmp_path):
    """A worker dies (a hostile file) after it took, but before it wrote, other batches: they are redone elsewhere."""
    pool = LocalPool(1)
    try:
        for i in range(4):
            pool.submit("pool_helpers.keep_or_crash", [i * 10 + j for j in range(3)], keeps=True)
        first = list(pool.drain())  # answered: the worker now holds 12 numbers
        pool.submit("pool_helpers.keep_or_crash", [100, "segv", 101], keeps=True,
                    on_crash=lambda item, why: ("crashed", item))
        numbers, other = released_numbers([*first, *pool.release_all("pool_helpers.release_kept", str(tmp_path))])
    finally:
        pool.close()
    assert numbers == sorted([i * 10 + j for i in range(4) for j in range(3)] + [100, 101])
    assert sorted(x for x in other if isinstance(x, int)) == [1, 1, 3, 3, 3, 3]  # replays add no count
    assert [x for x in other if isinstance(x, tuple)] == [("crashed", "segv")]


def test_an_exception_in_a_task_is_raised_here_with_its_message(helpers_on_path):
    pool = LocalPool(1)
    try:
        pool.submit("pool_helpers.fail_with_message", ["x.jpg"])
        with pytest.raises(ValueError, match="cannot use 'x.jpg': a message the build should show"):
            list(pool.drain())
    finally:
        pool.close()



def test_workers_import_the_preloaded_modules_as_they_start_and_ignore_one_that_fails(helpers_on_path):
    wanted = ["beam_jobs.encode_worker", "beam_jobs.shard_writer", "shard_utils.images"]
    pool = LocalPool(2, preload=("beam_jobs.encode_worker", "beam_jobs.shard_writer", "no_such_module_here"))
    try:
        pool.submit("pool_helpers.loaded_modules", [], wanted)
        pool.submit("pool_helpers.square_or_crash", [3, 4], 0.0)
        results = list(pool.drain())
    finally:
        pool.close()
    assert wanted in results  # imported before any task needed them (images through encode_worker)
    assert [9, 16] in results  # a module that cannot be imported costs the pool nothing


def test_a_local_build_starts_its_pool_before_building_the_graph(monkeypatch):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs import running
    from beam_jobs.config import BuildConfig

    started = []
    monkeypatch.setattr(LocalPool, "shared", classmethod(lambda cls, workers, preload=(): started.append(
        (workers, preload))))
    config = BuildConfig(input="in", output="out", temp_root="tmp", workers=2)
    running.start_local_pool(config, PipelineOptions(["--runner=FnApiRunner"]))
    running.start_local_pool(config, PipelineOptions(["--runner=FnApiRunner", "--direct_num_workers=2",
                                                      "--direct_running_mode=multi_threading"]))
    running.start_local_pool(BuildConfig(input="in", output="out", temp_root="tmp", workers=1),
                             PipelineOptions(["--runner=FnApiRunner"]))
    running.start_local_pool(config, PipelineOptions(["--runner=DataflowRunner"]))
    assert started == [(2, running.POOL_MODULES)]  # only where the steps run in this thread, with a pool


def test_a_build_runs_its_steps_in_the_pool_it_started_first(images, tmp_path, monkeypatch):
    from conftest import run_job

    started = []
    original = LocalPool.__init__

    def counting(self, workers, *args, **kwargs):
        started.append((workers, kwargs.get("preload", ())))
        original(self, workers, *args, **kwargs)

    monkeypatch.setattr(LocalPool, "__init__", counting)
    m = run_job(images, tmp_path / "out", "--workers", "2", "--num-cores", "2", "--no-progress")
    assert m.splits["train"].num_records == 36
    assert [w for w, _ in started] == [2] and started[0][1]  # one pool, the preloaded one, served every step


def test_work_started_early_is_taken_by_its_key_and_batches_meanwhile_still_come_back(helpers_on_path):
    pool = LocalPool(2)
    try:
        pool.start("walk", "pool_helpers.sleep_then", 0.3, {"found": [1, 2, 3]})
        for i in range(6):  # finished while take() waits: kept for results(), not lost
            pool.submit("pool_helpers.square_or_crash", [i], 0.0)
        assert pool.take("walk") == {"found": [1, 2, 3]}
        assert pool.take("walk") is None  # taken once
        assert pool.take("never started") is None
        got = sorted(x for result in pool.drain() for x in result)
    finally:
        pool.close()
    assert got == [i * i for i in range(6)]


@pytest.mark.parametrize("answer", ["fail", "segv"])
def test_early_work_that_fails_or_kills_its_worker_leaves_it_to_its_step_and_costs_no_batch(helpers_on_path, answer):
    pool = LocalPool(1)  # the batches queue behind the early work on the same worker: none of them started
    try:
        pool.start("walk", "pool_helpers.sleep_then", 0.1, answer)
        for i in range(3):
            pool.submit("pool_helpers.square_or_crash", [i], 0.0, on_crash=lambda item, why: ("crashed", item))
        assert pool.take("walk") is None  # the step then does the work itself
        got = [x for result in pool.drain() for x in result]
    finally:
        pool.close()
    assert sorted(got) == [0, 1, 4]  # not blamed for the crash: run again, whole


def test_a_build_with_workers_takes_its_listing_from_the_walk_they_began_early(tmp_path, monkeypatch):
    from conftest import run_job
    from readers import rejected, shard_bytes

    from beam_jobs import media_listing

    src = tmp_path / "in"
    write_images(src, {"a": 10, "b": 10})
    (src / "a" / "notes.txt").write_text("skipped, and named in skipped.jsonl")
    (src / "loose.jpg").write_bytes((src / "a" / "img0000.jpg").read_bytes())  # in no label folder: rejected
    one = run_job(src, tmp_path / "one", "--workers", "1", "--num-cores", "2", "--no-progress")

    def walked_here(*args, **kwargs):
        raise AssertionError("the build walked the input itself")

    monkeypatch.setattr(media_listing, "walk_chunks", walked_here)  # in this process only, not in the workers
    monkeypatch.setattr(media_listing, "walked_labels", walked_here)
    two = run_job(src, tmp_path / "two", "--workers", "2", "--num-cores", "2", "--no-progress")
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two") and shard_bytes(tmp_path / "two")
    assert rejected(tmp_path / "two") == rejected(tmp_path / "one") == {"loose.jpg": "no_label"}
    assert (tmp_path / "two" / "skipped.jsonl").read_text() == (tmp_path / "one" / "skipped.jsonl").read_text()
    assert (two.files_seen, two.skipped, two.labels) == (one.files_seen, one.skipped, one.labels)
    assert two.files_seen == 22
    with pytest.raises(Exception, match="walked the input itself"):  # where no worker began it, the build walks
        run_job(src, tmp_path / "three", "--workers", "1", "--num-cores", "2", "--no-progress")


def test_a_build_with_workers_takes_its_listing_rows_from_the_read_they_began_early(tmp_path, monkeypatch):
    from conftest import run_job
    from readers import rejected, shard_bytes

    from beam_jobs import transforms

    src = tmp_path / "in"
    write_images(src, {"a": 10, "b": 10})
    rows = [f"{label}/img{i:04d}.jpg,{label}" for label in "ab" for i in range(10)]
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n" + "\n".join(rows + ["a/img0000.jpg,a", "a/gone.jpg,"]) + "\n")
    args = ("--listing", listing, "--num-cores", "2", "--no-progress")
    one = run_job(src, tmp_path / "one", "--workers", "1", *args)

    def read_here(*args, **kwargs):
        raise AssertionError("the build read the listing itself")

    monkeypatch.setattr(transforms, "read_all_rows", read_here)  # in this process only, not in the workers
    two = run_job(src, tmp_path / "two", "--workers", "2", *args)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two") and shard_bytes(tmp_path / "two")
    assert rejected(tmp_path / "two") == rejected(tmp_path / "one") == {"a/img0000.jpg": "duplicate_row",
                                                                        "a/gone.jpg": "bad_row"}
    assert (two.files_seen, two.labels) == (one.files_seen, one.labels) and two.files_seen == 22
    with pytest.raises(Exception, match="read the listing itself"):  # where no worker began it, the build reads
        run_job(src, tmp_path / "three", "--workers", "1", *args)
