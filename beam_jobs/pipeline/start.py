"""StartRun: the run's identity and the output's lock.

A driver (a local build, or a launcher that submits and waits) decides the run before submitting, takes
the output's lock and renews it for the whole job: StartRun then only hands its RunInfo to the steps.

A template launch has no driver: the job decides its run when it runs. The decision is made once, then
made stable by a Reshuffle, so that a retried lock step takes the lock for the same run (acquiring a lock
the run already holds succeeds) instead of finding its own first attempt's lock. The lease is then kept by
the job's own processes (`keep_lease`): the one that took the lock, and each that works for the run, renews
it from a background thread until the run publishes or loses the lock. No step waits on the renewals, so
the run's RunInfo, a side input of most steps, is complete as soon as the lock is taken; and the lease runs
out once no process of the job is left.
"""
from __future__ import annotations

import datetime

import apache_beam as beam

from beam_jobs.errors import UsageError
from beam_jobs.run import claim
from beam_jobs.run.config import RunSettings
from beam_jobs.run.identity import RunInfo, new_run_id
from shard_utils.storage import lock as runlock

__all__ = ["StartRun", "decide_run", "take_lock", "keep_lease"]


class StartRun(beam.PTransform):
    """One RunInfo: the run's id, temporary folder and creation time (see the module's docstring)."""

    def __init__(self, config: RunSettings):
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
                | "TakeLock" >> beam.Map(take_lock, cfg)
                | "KeepLease" >> beam.Map(keep_lease, cfg))


def decide_run(config: RunSettings, now: datetime.datetime | None = None) -> RunInfo:
    """A new run's identity (no side effect: made stable before the lock is taken for it)."""
    now = now or datetime.datetime.now(datetime.UTC)
    run_id = new_run_id(now)
    return RunInfo(run_id, config.temp_dir(run_id), now.isoformat(timespec="seconds"))


def take_lock(run: RunInfo, config: RunSettings) -> RunInfo:
    """Take the output's lock for this run and apply the --overwrite rule; running it again for the same run
    gives the same answer. Temporary folders of dead earlier runs are removed once the lock is ours."""
    claim.take(config.output, run.run_id, run.created, config.lease_seconds)
    if claim.output_content(config.output) and not config.overwrite:
        runlock.release(config.output, run.run_id)
        raise UsageError(f"output {config.output} is not empty; pass --overwrite to replace the dataset there")
    claim.clear_leftovers(config.output, config.temp_root, run.run_id)
    return run


def keep_lease(run: RunInfo, config: RunSettings) -> RunInfo:
    """For a run decided inside the job: make sure this process renews its lease (a background thread, started
    once per process); returns the run. Steps that read the run call it, so the lease lives as long as any
    process works for the run. A driver-decided run is renewed by its driver: nothing to do."""
    if config.run_id is None:
        runlock.keep(config.output, run.run_id, config.lease_seconds)
    return run
