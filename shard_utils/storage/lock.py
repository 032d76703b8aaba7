"""A lease lock on an output folder, so two builds never write one dataset at once.

The lock is a small JSON object `<output>/.tpu-shards-lock.json` naming the run that holds it and
until when. It works on local folders and gs:// alike through the storage layer's atomic
create and compare-and-swap. A holder renews its lease while it works; a lock whose lease ran
out, or whose holder is provably dead (same host, process gone), is taken over.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass

from shard_utils import storage

LOCK_NAME = ".tpu-shards-lock.json"  # the output's lock, beside the dataset

LEASE_SECONDS = 15 * 60


class OutputBusy(ValueError):
    """Another live run holds the output's lock."""


class LockLost(RuntimeError):
    """This run's lock was taken over (its lease ran out) before it could publish."""


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
    def from_bytes(data: bytes) -> "Lease | None":
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


def renew(output: str, run_id: str, lease_seconds: float = LEASE_SECONDS) -> bool:
    """Extend this run's lease; False if the lock is no longer ours (or changed under us)."""
    path = lock_path(output)
    found = storage.read_versioned(path)
    if found is None:
        return False
    holder = Lease.from_bytes(found[0])
    if holder is None or holder.run_id != run_id:
        return False
    renewed = Lease(holder.run_id, holder.started, holder.host, holder.pid, time.time() + lease_seconds)
    return storage.replace_if_version(path, renewed.to_bytes(), found[1])


def holds(output: str, run_id: str) -> bool:
    """Whether this run holds the output's lock now."""
    found = storage.read_versioned(lock_path(output))
    holder = Lease.from_bytes(found[0]) if found else None
    return holder is not None and holder.run_id == run_id


def release(output: str, run_id: str) -> None:
    """Give the lock back if this run holds it (never removes another run's lock)."""
    path = lock_path(output)
    found = storage.read_versioned(path)
    if found is None:
        return
    holder = Lease.from_bytes(found[0])
    if holder is not None and holder.run_id == run_id:
        storage.delete_if_version(path, found[1])
