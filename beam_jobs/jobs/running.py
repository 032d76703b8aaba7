"""Running a job whose output is a dataset (a build, an append, a reshard): lock lease, Ctrl-C, progress,
failure, clean-up. One place, so every job that writes a dataset fails, is interrupted and cleans up alike.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from beam_jobs import progress
from beam_jobs.errors import UsageError
from beam_jobs.jobs import options
from beam_jobs.jobs.dofn_specs import read_once
from beam_jobs.jobs.in_process import in_process_run
from beam_jobs.local.pool import LocalPool
from beam_jobs.publish import move_shard
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig
from shard_utils import storage
from shard_utils.errors import PlanError
from shard_utils.format import manifest
from shard_utils.sharding.encode_run import encode_run
from shard_utils.sharding.run_parts import join_parts
from shard_utils.sharding.writer import write_shard
from shard_utils.storage import lock as runlock

__all__ = [
    "guard_interrupts", "execute", "long_lived_objects_left_alone", "start_local_pool", "runs_here", "LeaseKeeper",
    "abandon", "POOLED", "raise_job_failure", "still_running", "remove_if_empty"
]

POOLED = (encode_run, join_parts, write_shard, move_shard)  # what a local run's steps hand to the worker processes


def guard_interrupts(config: BuildConfig, local: bool):
    """Within the block, Ctrl-C ends a local run in one line saying what state the output is in."""
    if config.run_id is None or not local:
        return contextlib.nullcontext()
    from beam_jobs.jobs.interrupt import LocalInterrupts

    had_dataset = storage.exists(storage.join(config.output, manifest.MANIFEST_NAME))
    return LocalInterrupts(config, had_dataset=had_dataset, abandon=abandon)


def execute(config: BuildConfig, opts: PipelineOptions, build: Callable[[beam.Pipeline], None], *,
            created_output: bool = False, show_progress: bool | None = False):
    """Build the graph, run it and wait; returns the PipelineResult (None when only a template was written).

    The run holds the output's lock with a lease; a failed run removes its temporary data and gives the
    lock back; a known failure is raised as its one-line error."""
    runner = opts.view_as(StandardOptions).runner or ""
    cloud = opts.view_as(GoogleCloudOptions)
    local = runner in options.LOCAL_RUNNERS
    lease = LeaseKeeper(config.output, config.run_id) if config.run_id else contextlib.nullcontext()
    result = None
    try:
        in_process = in_process_run() if runs_here(opts) else contextlib.nullcontext()
        with lease, progress.showing(show_progress if local else False), long_lived_objects_left_alone(), in_process:
            progress.advance("list", 0)  # the listing bar shows from the start: listing a bucket can take minutes
            start_local_pool(config, opts)
            read_once()
            pipeline = beam.Pipeline(options=opts)
            build(pipeline)
            gc.freeze()  # the graph, too, lives until the run is over
            result = pipeline.run()
            if cloud.template_location:
                print(f"tpu-shards: Dataflow template written to {cloud.template_location}")
                return None
            if local or show_progress is False:
                result.wait_until_finish()
            else:  # a remote job: its console link, then its counters every 30 s while it runs
                progress.watch(result, 30, project=cloud.project, region=cloud.region)
            raise_job_failure(result)
    except BaseException:
        if still_running(result):
            # Ctrl-C while waiting for Dataflow: the job goes on and needs its temporary objects and lock.
            job = getattr(result, "job_id", lambda: "")()
            print(f"tpu-shards: stopped waiting; the job keeps running (gcloud dataflow jobs cancel {job} "
                  f"--region {cloud.region or 'REGION'} to stop it)", file=sys.stderr)
            raise
        if config.run_id is not None:
            abandon(config, config.run_id)
        if created_output:
            remove_if_empty(config.output)
        raise
    finally:
        LocalPool.close_all()  # the encode and write steps' worker processes
    return result


@contextlib.contextmanager
def long_lived_objects_left_alone():
    """Within the block, Python's cyclic garbage collector leaves alone the objects that exist when it starts
    (and when `gc.freeze` is called again): modules, Beam, the graph. A full collection walks every object, and
    in a build's driver that pause holds up the steps and the encode processes waiting on them. Afterwards the
    objects are collected as before."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def start_local_pool(config: BuildConfig, opts: PipelineOptions) -> None:
    """Start the local build's worker processes before the graph is built, so that their start-up (Python,
    Pillow, the modules of the functions they will run) overlaps Beam's graph construction instead of
    following it. Only where the steps will run in this thread: Beam's in-process runner in its default
    single-threaded mode."""
    runner = opts.view_as(StandardOptions).runner or ""
    direct = opts.view_as(DirectOptions)
    if (config.workers > 1 and runner in options.LOCAL_RUNNERS
            and not opts.view_as(GoogleCloudOptions).template_location and (direct.direct_num_workers or 1) <= 1):
        LocalPool.shared(config.workers, preload=tuple(dict.fromkeys(fn.__module__ for fn in POOLED)))


def runs_here(opts: PipelineOptions) -> bool:
    """Whether the graph is run in this process: by Beam's in-process runner, in this process's threads (not
    its worker subprocesses), and not only written as a template."""
    runner = opts.view_as(StandardOptions).runner or ""
    return (runner in options.LOCAL_RUNNERS and not opts.view_as(GoogleCloudOptions).template_location
            and opts.view_as(DirectOptions).direct_running_mode != "multi_processing")


class LeaseKeeper:
    """Renews the run's lock on the output in the background while the driver waits for the job."""

    def __init__(self, output: str, run_id: str):
        self.output, self.run_id = output, run_id

    def __enter__(self) -> LeaseKeeper:
        runlock.keep(self.output, self.run_id)
        return self

    def __exit__(self, *exc) -> None:
        runlock.stop_keeping(self.output, self.run_id)


def abandon(config: BuildConfig, run_id: str) -> None:
    """After a failed local run: remove its temporary data (keeping its reports), and the dataset files it left
    in an output without a manifest, and give the lock back."""
    try:
        if runlock.holds(config.output, run_id):
            claim.remove_orphaned_files(config.output)
    except storage.StorageError:
        pass  # the next run into this output clears it
    temp = config.temp_dir(run_id)
    try:
        names = storage.list_names(temp)
        for name in names:
            if name.rstrip("/") != "report":
                storage.delete_prefix(storage.join(temp, name.rstrip("/")))
        if "report/" not in names:
            claim.remove_run_folder(config.temp_root, temp)
    except storage.StorageError:
        pass  # removed by the next run into this output
    try:
        runlock.release(config.output, run_id)
    except storage.StorageError:
        pass  # the lease runs out on its own


def raise_job_failure(result) -> None:
    """Raise, as its own type, the one-line failure a local job reported through its `failure` metric."""
    from apache_beam.metrics.metric import MetricsFilter

    from beam_jobs.run.failure import FAILURE_METRIC
    from beam_jobs.run.tally import NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(FAILURE_METRIC))
    except Exception:  # noqa: BLE001 - a runner without metrics: remote runs fail the job instead
        return
    for metric in found.get("string_sets", []):
        for text in sorted(metric.committed or metric.attempted or ()):
            kind, _, message = text.partition(": ")
            raise (UsageError if kind == "UsageError" else PlanError)(message)


def still_running(result) -> bool:
    """Whether a job may still be running after the driver stopped waiting (a remote runner, interrupted)."""
    if result is None:  # the in-process runner returns only when the job is over
        return False
    from apache_beam.runners.runner import PipelineState

    try:
        return not PipelineState.is_terminal(result.state)
    except Exception:  # noqa: BLE001 - state unknown: do not delete what a running job may need
        return True


def remove_if_empty(path: str) -> None:
    try:
        if not storage.is_gcs(path) and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
    except OSError:
        pass


