"""A lease lock on an output folder, so two builds never write one dataset at once.

The lock is a small JSON object `<output>/.tpu-shards-lock.json` naming the run that holds it and
until when. It works on local folders and gs:// alike through the storage layer's atomic
create and compare-and-swap. A holder renews its lease while it works; a lock whose lease ran
out, or whose holder is provably dead (same host, process gone), is taken over.

A run decided inside a job (a template launch) has no driver to renew its lease: each process that works for
it keeps a background renewer (`keep`), which writes a renewal only once a quarter of the lease has passed
since the last, so a hundred workers write the lock about as often as one.
"""
from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace

from shard_utils import storage
from shard_utils.errors import TpuShardsError

__all__ = [
    "LOCK_NAME", "LEASE_SECONDS", "OutputBusy", "Lease", "lock_path", "describe", "acquire", "refresh", "keep",
    "stop_keeping", "holds", "release"
]

LOCK_NAME = ".tpu-shards-lock.json"  # the output's lock, beside the dataset

LEASE_SECONDS = 15 * 60


class OutputBusy(ValueError, TpuShardsError):
    """Another live run holds the output's lock."""


@dataclass(frozen=True)
class Lease:
    """Who holds an output and until when (seconds since the epoch)."""

    run_id: str
    started: str
    host: str
    pid: int
    expires: float

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def from_bytes(data: bytes) -> Lease | None:
        try:
            obj = json.loads(data)
            return Lease(str(obj["run_id"]), str(obj["started"]), str(obj["host"]), int(obj["pid"]),
                         float(obj["expires"]))
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: treated as stale


def lock_path(output: str) -> str:
    return storage.join(output, LOCK_NAME)


def _alive(lease: Lease, now: float) -> bool:
    """Whether the holder may still be working: lease not run out, and not provably dead on this host."""
    if lease.expires <= now:
        return False
    if lease.host == socket.gethostname():
        try:
            os.kill(lease.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


def describe(lease: Lease) -> str:
    started = lease.started or "an unknown time"
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lease.expires))
    return f"run {lease.run_id} (host {lease.host}, pid {lease.pid}) started {started}; its lease runs until {until}"


def acquire(output: str, run_id: str, started: str, lease_seconds: float = LEASE_SECONDS) -> Lease:
    """Take the output's lock for this run, or raise OutputBusy naming the run that holds it."""
    path = lock_path(output)
    for _ in range(5):
        now = time.time()
        mine = Lease(run_id, started, socket.gethostname(), os.getpid(), now + lease_seconds)
        found = storage.read_versioned(path)
        if found is None:
            if storage.create_exclusive(path, mine.to_bytes()):
                return mine
            continue  # someone created it between our read and our create: look again
        data, version = found
        holder = Lease.from_bytes(data)
        if holder is not None and holder.run_id != run_id and _alive(holder, now):
            raise OutputBusy(f"output {output} is being written by another build: {describe(holder)}. Wait for "
                             f"it to finish; if it was killed, its lock is taken over once the lease runs out")
        if storage.replace_if_version(path, mine.to_bytes(), version):
            return mine
    raise OutputBusy(f"output {output}: could not take its lock (other builds keep changing it)")


def refresh(output: str, run_id: str, lease_seconds: float = LEASE_SECONDS, *, due: float = 0.0) -> bool:
    """Renew this run's lease once more than `due` seconds have passed since it was last renewed (0: now); True
    while the run holds the lock, also when another of its processes renewed it first."""
    path = lock_path(output)
    found = storage.read_versioned(path)
    holder = Lease.from_bytes(found[0]) if found else None
    if found is None or holder is None or holder.run_id != run_id:
        return False
    now = time.time()
    if holder.expires - now > lease_seconds - due:
        return True  # renewed less than `due` seconds ago, by this process or another
    if storage.replace_if_version(path, replace(holder, expires=now + lease_seconds).to_bytes(), found[1]):
        return True
    return holds(output, run_id)


_RELEASE_TRIES = 5  # renewals come at most once a quarter lease per process: a few re-reads outlast them

_keepers: dict[tuple[str, str], tuple[threading.Thread, threading.Event]] = {}
_keepers_guard = threading.Lock()


def keep(output: str, run_id: str, lease_seconds: float = LEASE_SECONDS) -> None:
    """Renew this run's lease from a daemon thread of this process until the run no longer holds the lock
    (it published, gave up, or lost it) or `stop_keeping`; one thread per process and run, however often
    called. A renewal is written once a quarter of the lease has passed since the last, by whichever of the
    run's processes looks first."""
    key = (output, run_id)
    with _keepers_guard:
        found = _keepers.get(key)
        if found is not None and found[0].is_alive():
            return
        stop = threading.Event()
        thread = threading.Thread(target=_keep, args=(output, run_id, lease_seconds, stop), daemon=True,
                                  name=f"tpu-shards-lease-{run_id}")
        _keepers[key] = (thread, stop)
        thread.start()


def stop_keeping(output: str, run_id: str) -> None:
    """Stop this process's renewals of the run's lease (the lock itself is left as it is)."""
    with _keepers_guard:
        found = _keepers.pop((output, run_id), None)
    if found is not None:
        found[1].set()


def _keep(output: str, run_id: str, lease_seconds: float, stop: threading.Event) -> None:
    every = lease_seconds / 4
    while not stop.wait(every * random.uniform(0.5, 1.0)):  # spread over the run's processes
        try:
            if not refresh(output, run_id, lease_seconds, due=every):
                return
        except storage.StorageError:
            pass  # tried again next time; the lease is long


def holds(output: str, run_id: str) -> bool:
    """Whether this run holds the output's lock now."""
    found = storage.read_versioned(lock_path(output))
    holder = Lease.from_bytes(found[0]) if found else None
    return holder is not None and holder.run_id == run_id


def release(output: str, run_id: str) -> None:
    """Give the lock back if this run holds it (never removes another run's lock); this process stops renewing it.
    A renewal by another of the run's processes (or this one's keeper, mid-write) between the read and the delete
    is read again, so the lock is not left behind until its lease runs out."""
    stop_keeping(output, run_id)
    path = lock_path(output)
    for _ in range(_RELEASE_TRIES):
        found = storage.read_versioned(path)
        if found is None:
            return
        holder = Lease.from_bytes(found[0])
        if holder is None or holder.run_id != run_id or storage.delete_if_version(path, found[1]):
            return
