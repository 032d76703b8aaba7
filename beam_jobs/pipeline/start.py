"""StartRun and KeepLease: the run's identity and the output's lock.

A driver (a local build, or a launcher that submits and waits) decides the run before submitting, takes
the output's lock and renews it for the whole job: StartRun then only hands its RunInfo to the steps.

A template launch has no driver: the job decides its run when it runs. The decision is made once, then
made stable by a Reshuffle, so that a retried lock step takes the lock for the same run (acquiring a lock
the run already holds succeeds) instead of finding its own first attempt's lock. KeepLease is then the one
place that renews the lease: one element, one thread, until the run has published or lost the lock.
Workers never write the lock.
"""
from __future__ import annotations

import datetime
import threading
import time
import uuid
from typing import Callable

import apache_beam as beam

from shard_utils.format import manifest
from shard_utils.storage import lock as runlock
from shard_utils import storage

from beam_jobs.jobs.config import BuildConfig, RunInfo
from beam_jobs.errors import UsageError

__all__ = ["StartRun", "KeepLease", "new_run_id", "decide_run", "take_lock", "keep_lease_until_done"]


class StartRun(beam.PTransform):
    """One RunInfo: the run's id, temporary folder and creation time (see the module's docstring)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pbegin):
        cfg = self.config
        if cfg.run_id:
            return pbegin | "Decided" >> beam.Create([RunInfo(cfg.run_id, cfg.temp_dir(cfg.run_id), cfg.created or "")])
        return (pbegin
                | "Once" >> beam.Create([None])
                | "Decide" >> beam.Map(lambda _: decide_run(cfg))
                | "Stable" >> beam.Reshuffle()
                | "TakeLock" >> beam.Map(take_lock, cfg))


def new_run_id(now: datetime.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def decide_run(config: BuildConfig, now: datetime.datetime | None = None) -> RunInfo:
    """A new run's identity (no side effect: made stable before the lock is taken for it)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    run_id = new_run_id(now)
    return RunInfo(run_id, config.temp_dir(run_id), now.isoformat(timespec="seconds"))


def take_lock(run: RunInfo, config: BuildConfig) -> RunInfo:
    """Take the output's lock for this run and apply the --overwrite rule; running it again for the same run
    gives the same answer. Temporary folders of dead earlier runs are removed once the lock is ours."""
    from beam_jobs.publish import clean_stale_runs, output_content, remove_unfinished_writes

    try:
        runlock.acquire(config.output, run.run_id, run.created)
    except runlock.OutputBusy as exc:
        raise UsageError(str(exc)) from None
    if output_content(config.output) and not config.overwrite:
        runlock.release(config.output, run.run_id)
        raise UsageError(f"output {config.output} is not empty; pass --overwrite to replace the dataset there")
    clean_stale_runs(config.temp_root, run.run_id)
    remove_unfinished_writes(config.output)
    return run


class KeepLease(beam.PTransform):
    """For a run decided inside the job: renews its lease until it has published (one element, one thread)."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, run):
        return run | "Renew" >> beam.Map(keep_lease_until_done, self.config)


def published_by(output: str, run: RunInfo) -> bool:
    """Whether the dataset in output is the one this run published."""
    try:
        return manifest.load(output).created == run.created
    except (manifest.ManifestError, storage.StorageError):
        return False


def keep_lease_until_done(run: RunInfo, config: BuildConfig, *, every: float = runlock.LEASE_SECONDS / 4,
                          wait: Callable[[float], bool] | None = None) -> int:
    """Renew the run's lease every `every` seconds until the run no longer holds the lock (it published and
    gave it back, or lost it); returns how many renewals were made. `wait(seconds)` returns True to stop
    early (default: sleep)."""
    stop = threading.Event()
    wait = wait or stop.wait
    renewals = 0
    while True:
        try:
            if not runlock.renew(config.output, run.run_id):
                return renewals
            renewals += 1
        except storage.StorageError:
            pass  # tried again next time; the lease is long
        if wait(every):
            return renewals


def _now() -> float:
    return time.time()
