"""Running a job whose output is a dataset (a build, an append, a reshard): lock lease, Ctrl-C, progress,
failure, clean-up. One place, so every job that writes a dataset fails, is interrupted and cleans up alike.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from typing import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions
from apache_beam.runners.worker import statesampler

from shard_utils import manifest, runlock, storage
from shard_utils.plan import PlanError

from . import options, progress, publish
from .config import BuildConfig
from .errors import UsageError
from .local_pool import LocalPool


def guard_interrupts(config: BuildConfig, local: bool):
    """Within the block, Ctrl-C ends a local run in one line saying what state the output is in."""
    if config.run_id is None or not local:
        return contextlib.nullcontext()
    from .interrupt import LocalInterrupts

    had_dataset = storage.exists(storage.join(config.output, manifest.MANIFEST_NAME))
    return LocalInterrupts(config, had_dataset=had_dataset)


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
    freeze_imported_objects()
    try:
        with lease, progress.showing(show_progress if local else False), \
                quick_stage_ends(local and not cloud.template_location):
            start_local_pool(config, opts)
            pipeline = beam.Pipeline(options=opts)
            build(pipeline)
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


LOCAL_SAMPLING_MS = 10  # the in-process runner's state-sampling period (Beam's default: 200 ms)


@contextlib.contextmanager
def quick_stage_ends(local: bool):
    """Within the block, stages of Beam's in-process runner end within 10 ms of their last element.

    Each bundle ends by joining Beam's state-sampler thread, which sleeps up to 200 ms between samples
    (ramping up over a stage's first second), so every long stage idled up to 200 ms at its end: 50-120 ms
    measured after the encode step, 30-50 ms after the shard writers. Nothing reads those samples here.
    Left alone on Dataflow, and when Beam's sampler is not the one this was measured on."""
    init = statesampler.StateSampler.__init__
    defaults = getattr(init, "__defaults__", None)
    if not local or defaults != (getattr(statesampler, "DEFAULT_SAMPLING_PERIOD_MS", None),):
        yield
        return
    init.__defaults__ = (LOCAL_SAMPLING_MS,)
    try:
        yield
    finally:
        init.__defaults__ = defaults


def freeze_imported_objects() -> None:
    """Leave the objects that exist before the first run of this process (the modules of Beam, TensorFlow and
    their like, some 200,000) out of the cyclic garbage collector's passes from now on: a full pass over
    them stalled the driver, and every worker waiting on it, for 0.08-0.1 s once or twice per build. Once
    per process: the garbage of a later run is then collected as usual (freezing at every run would keep
    the previous runs' uncollected garbage forever)."""
    global _FROZEN
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


_FROZEN = False


POOL_MODULES = ("beam_jobs.encode_worker", "beam_jobs.shard_writer")  # what the encode and write steps run


def start_local_pool(config: BuildConfig, opts: PipelineOptions) -> None:
    """Start the local build's worker processes before the graph is built, so that their start-up (Python,
    Pillow, the job's modules) overlaps Beam's graph construction instead of following it. Only where the
    steps will run in this thread: Beam's in-process runner in its default single-threaded mode."""
    runner = opts.view_as(StandardOptions).runner or ""
    direct = opts.view_as(DirectOptions)
    if (config.workers > 1 and runner in options.LOCAL_RUNNERS and not opts.view_as(GoogleCloudOptions).template_location
            and (direct.direct_num_workers or 1) <= 1):
        LocalPool.shared(config.workers, preload=POOL_MODULES)


class LeaseKeeper:
    """Renews the run's lock on the output in the background while the driver waits for the job."""

    def __init__(self, output: str, run_id: str, every: float = runlock.LEASE_SECONDS / 4):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(output, run_id, every), daemon=True,
                                        name="tpu-shards-lease")

    def _loop(self, output: str, run_id: str, every: float) -> None:
        while not self._stop.wait(every):
            try:
                runlock.renew(output, run_id)
            except storage.StorageError:
                pass  # tried again next time; the lease is long

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


def abandon(config: BuildConfig, run_id: str) -> None:
    """After a failed local run: remove its temporary data (keeping its reports) and give the lock back."""
    temp = config.temp_dir(run_id)
    try:
        names = storage.list_names(temp)
        for name in names:
            if name.rstrip("/") != "report":
                storage.delete_prefix(storage.join(temp, name.rstrip("/")))
        if "report/" not in names:
            publish.remove_run_folder(config.temp_root, temp)
    except storage.StorageError:
        pass  # removed by the next run into this output
    try:
        runlock.release(config.output, run_id)
    except storage.StorageError:
        pass  # the lease runs out on its own


def raise_job_failure(result) -> None:
    """Raise, as its own type, the one-line failure a local job reported through its `failure` metric."""
    from apache_beam.metrics.metric import MetricsFilter

    from .transforms import FAILURE_METRIC, NAMESPACE

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


