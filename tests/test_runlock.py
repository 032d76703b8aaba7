"""The output lock: one live build per output, on local folders and on a bucket; stale locks are taken over."""
from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import threading
import time

import pytest

from shard_utils import storage
from shard_utils.storage import lock as runlock


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
    assert not runlock.refresh(output, "run-a")
    assert runlock.refresh(output, "run-b")


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


def test_a_renewal_is_written_only_once_its_due_time_has_passed(output):
    """Many processes of one run may keep its lease: each writes only when the last renewal is older than `due`."""
    runlock.acquire(output, "run-a", "t", lease_seconds=100)
    path = runlock.lock_path(output)
    before = storage.read_versioned(path)
    assert runlock.refresh(output, "run-a", 100, due=25)  # renewed a moment ago: held, nothing written
    assert storage.read_versioned(path) == before
    assert runlock.refresh(output, "run-a", 100)
    after = storage.read_versioned(path)
    assert after[1] != before[1]
    assert runlock.Lease.from_bytes(after[0]).expires > runlock.Lease.from_bytes(before[0]).expires
    assert not runlock.refresh(output, "run-b", 100)  # not the holder: nothing written
    assert storage.read_versioned(path) == after


def keepers(run_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"tpu-shards-lease-{run_id}"]


def wait_until(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def test_a_kept_lease_is_renewed_in_the_background_until_the_run_gives_it_back(tmp_path):
    out = str(tmp_path / "out")
    first = runlock.acquire(out, "run-kept", "t", lease_seconds=0.4)
    runlock.keep(out, "run-kept", 0.4)
    runlock.keep(out, "run-kept", 0.4)  # one thread per process and run, however often asked
    (keeper,) = keepers("run-kept")
    lease = lambda: runlock.Lease.from_bytes(storage.read_bytes(runlock.lock_path(out)))  # noqa: E731
    wait_until(lambda: lease().expires > first.expires + 0.4, 10)  # renewed more than once
    assert time.time() < lease().expires
    runlock.release(out, "run-kept")
    keeper.join(5)
    assert not keeper.is_alive() and not storage.exists(runlock.lock_path(out))


def test_a_keeper_stops_once_another_run_holds_the_lock(tmp_path):
    out = str(tmp_path / "out")
    runlock.acquire(out, "run-lost", "t", lease_seconds=0.4)
    runlock.keep(out, "run-lost", 0.4)
    (keeper,) = keepers("run-lost")
    other = runlock.Lease("run-new", "t", socket.gethostname(), 1, time.time() + 3600)
    storage.write_bytes(runlock.lock_path(out), other.to_bytes())
    keeper.join(5)
    assert not keeper.is_alive()
    assert storage.read_bytes(runlock.lock_path(out)) == other.to_bytes()


def test_release_reads_again_when_a_renewal_lands_between_its_read_and_its_delete(output, monkeypatch):
    runlock.acquire(output, "run-a", "now", lease_seconds=60.0)
    real = storage.read_versioned
    renewals = []

    def read_then_renewed(path):
        found = real(path)
        if not renewals:  # another of the run's processes renews just after release read the lock
            renewals.append(path)
            assert runlock.refresh(output, "run-a", 60.0)
        return found

    monkeypatch.setattr(storage, "read_versioned", read_then_renewed)
    runlock.release(output, "run-a")
    monkeypatch.setattr(storage, "read_versioned", real)
    assert renewals and not runlock.holds(output, "run-a")
    runlock.acquire(output, "run-b", "later")  # the next run gets in at once, not after the lease
