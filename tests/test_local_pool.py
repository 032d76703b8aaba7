"""The local build's worker pool: every task answered, a crash costs only its task, errors come back, no orphans."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pool_helpers
import pytest
from conftest import write_images

from beam_jobs.local.pool import Crashed, Done, LocalPool, Raised, describe_exit, task_name
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import EncodeSettings, encode_item

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def helpers_on_path(monkeypatch):
    """Worker processes import test helpers by name: put the tests folder on their PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def outcomes(pool: LocalPool, tickets: dict) -> dict:
    """What came back for each submitted task, by what it was submitted with."""
    return {tickets[ticket]: outcome for ticket, outcome in pool.drain()}


def test_every_task_comes_back_and_a_crash_costs_only_its_task(helpers_on_path):
    pool = LocalPool(2)
    try:
        items = [*range(20), "segv", *range(20, 30)]
        got = outcomes(pool, {pool.submit(pool_helpers.square_or_crash, item): item for item in items})
    finally:
        pool.close()
    assert {k: v for k, v in got.items() if k != "segv"} == {i: Done(i * i) for i in range(30)}
    assert got["segv"] == Crashed("the decoder crashed the worker process (SIGSEGV)")


def test_a_task_submitted_alone_runs_with_nothing_beside_it(helpers_on_path):
    """submit_alone (a retry after the system killed a worker) waits for the tasks in flight, and none starts
    until it ends; the tasks queued after it then run side by side again."""
    pool = LocalPool(3)
    try:
        tickets = {pool.submit(pool_helpers.interval, 0.2): f"before{i}" for i in range(3)}
        tickets[pool.submit_alone(pool_helpers.interval, 0.2)] = "alone"
        tickets.update({pool.submit(pool_helpers.interval, 0.2): f"after{i}" for i in range(3)})
        got = {name: outcome.value for name, outcome in outcomes(pool, tickets).items()}
    finally:
        pool.close()
    start, end = got.pop("alone")
    assert all(e <= start or s >= end for s, e in got.values()), (start, end, got)
    assert max(got[f"before{i}"][1] for i in range(3)) <= start <= end <= min(got[f"after{i}"][0] for i in range(3))


def test_a_worker_killed_by_the_system_says_so():
    assert Crashed("x", killed=True).killed and not Crashed("x").killed
    assert "killed (SIGKILL), as the system does when memory runs out" in describe_exit(-signal.SIGKILL)


def test_pool_results_are_the_inline_results(tmp_path):
    write_images(tmp_path / "in", {"a": 6, "b": 6})
    items = [MediaItem(f"{p.parent.name}/{p.name}", str(p), p.stat().st_size, (p.parent.name,))
             for p in sorted((tmp_path / "in").rglob("*.jpg"))]
    settings = EncodeSettings(label_ids={"a": 0, "b": 1})
    pool = LocalPool(2)
    try:
        got = outcomes(pool, {pool.submit(encode_item, item, settings): item.source_id for item in items})
    finally:
        pool.close()
    for item in items:
        inline = encode_item(item, settings)
        pooled = got[item.source_id].value
        assert (pooled.framed, pooled.split, pooled.meta) == (inline.framed, inline.split, inline.meta)


def test_an_exception_in_a_task_comes_back_with_its_message(helpers_on_path):
    pool = LocalPool(1)
    try:
        got = outcomes(pool, {pool.submit(pool_helpers.fail_with_message, "x.jpg"): "x"})
    finally:
        pool.close()
    assert isinstance(got["x"], Raised) and isinstance(got["x"].error, ValueError)
    assert str(got["x"].error) == "cannot use 'x.jpg': a message the build should show"


def test_an_answer_the_build_cannot_read_fails_it_in_one_line_instead_of_hanging(helpers_on_path):
    pool = LocalPool(1)
    try:
        pool.submit(pool_helpers.answer_unloadable, 1)
        with pytest.raises(RuntimeError, match=r"local pool: cannot read a worker's answer \(ValueError: this answer "
                                               r"cannot be loaded here\)"):
            list(pool.drain())
    finally:
        pool.close()


def test_tasks_are_functions_a_worker_can_import():
    assert task_name(encode_item) == "shard_utils.media.encode:encode_item"
    with pytest.raises(ValueError, match="module-level function"):
        task_name(lambda: 1)


def test_workers_stay_out_of_ctrl_c_and_stop_when_told(helpers_on_path):
    pool = LocalPool(2)
    pids = pool.pids()
    assert all(os.getpgid(pid) != os.getpgid(0) for pid in pids)  # a terminal's Ctrl-C does not reach them
    tickets = {pool.submit(pool_helpers.square_or_crash, i): i for i in range(2)}
    assert outcomes(pool, tickets) == {0: Done(0), 1: Done(1)}  # both workers are up
    pool.submit(pool_helpers.square_or_crash, "slow", 30.0)
    for pid in pids:
        os.kill(pid, signal.SIGINT)  # even sent to them directly, Ctrl-C is the parent's to handle
    assert all(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in pids)
    pool.kill()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


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


@pytest.mark.slow
def test_a_build_with_workers_uses_the_pool_it_started_before_the_graph(images, tmp_path, monkeypatch):
    from conftest import run_job

    started = []
    original = LocalPool.__init__

    def counting(self, workers, *args, **kwargs):
        started.append(workers)
        original(self, workers, *args, **kwargs)

    monkeypatch.setattr(LocalPool, "__init__", counting)
    run_job(images, tmp_path / "out", "--workers", "2")
    assert started == [2]


def test_workers_import_the_preloaded_modules_before_their_first_task(helpers_on_path):
    """`preload` modules are imported as a worker starts (a build's task modules, while its graph is built);
    one that cannot be imported leaves the worker answering tasks."""
    pool = LocalPool(1, preload=("colorsys", "no_such_module_for_tpu_shards"))
    try:
        ticket = pool.submit(pool_helpers.imported, ["colorsys", "wave"])
        assert dict(pool.drain()) == {ticket: Done([True, False])}
    finally:
        pool.close()
