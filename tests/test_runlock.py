"""The output lock: one live build per output, on local folders and on a bucket; stale locks are taken over."""
from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import time

import pytest

from shard_utils.storage import lock as runlock
from shard_utils import storage


@pytest.fixture(params=["local", "gcs"])
def output(request, tmp_path):
    """An output folder; on gs://, behind a proxy that checks generation preconditions as GCS does
    (the emulator ignores them)."""
    if request.param == "local":
        yield str(tmp_path / "out")
        return
    from gcs_fixtures import PreconditionProxy, storage_host

    gcs = request.getfixturevalue("gcs")
    bucket = gcs.new_bucket("lock")
    with PreconditionProxy(gcs.url) as proxy, storage_host(proxy.url):
        yield f"gs://{bucket}/out"


def test_second_run_is_refused_naming_the_first(output):
    first = runlock.acquire(output, "run-a", "2026-11-23T10:00:00+00:00")
    with pytest.raises(runlock.OutputBusy) as err:
        runlock.acquire(output, "run-b", "later")
    message = str(err.value)
    assert "run run-a" in message and "started 2026-11-23T10:00:00+00:00" in message and output in message
    assert runlock.holds(output, "run-a") and not runlock.holds(output, "run-b")
    assert first.run_id == "run-a"


def test_release_lets_the_next_run_in_and_never_drops_another_runs_lock(output):
    runlock.acquire(output, "run-a", "t")
    runlock.release(output, "run-b")  # not the holder: nothing happens
    assert runlock.holds(output, "run-a")
    runlock.release(output, "run-a")
    runlock.acquire(output, "run-b", "t")
    assert runlock.holds(output, "run-b")


def test_an_expired_lease_is_taken_over_and_its_holder_can_no_longer_renew(output):
    runlock.acquire(output, "run-a", "t", lease_seconds=0.5)
    time.sleep(0.6)
    runlock.acquire(output, "run-b", "t")
    assert runlock.holds(output, "run-b")
    assert not runlock.renew(output, "run-a")
    assert runlock.renew(output, "run-b")


def test_a_dead_local_holder_is_taken_over_at_once(tmp_path):
    out = str(tmp_path / "out")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = runlock.Lease("run-dead", "t", socket.gethostname(), dead.pid, time.time() + 3600)
    storage.write_bytes(runlock.lock_path(out), lease.to_bytes())
    runlock.acquire(out, "run-b", "t")
    assert runlock.holds(out, "run-b")


def test_an_unreadable_lock_counts_as_stale(output):
    storage.write_bytes(runlock.lock_path(output), b"{not json")
    runlock.acquire(output, "run-b", "t")
    assert runlock.holds(output, "run-b")


def _race(output: str, name: str, start: float, queue) -> None:
    from gcs_fixtures import reset_clients

    reset_clients()
    while time.time() < start:
        time.sleep(0.001)
    try:
        runlock.acquire(output, name, "t")
        queue.put(name)
    except runlock.OutputBusy:
        queue.put(None)


def test_racing_builds_get_exactly_one_lock(output):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start = time.time() + 2.0
    procs = [ctx.Process(target=_race, args=(output, f"run-{i}", start, queue)) for i in range(4)]
    for p in procs:
        p.start()
    winners = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    won = [w for w in winners if w]
    assert len(won) == 1 and runlock.holds(output, won[0])
