"""Running a job whose output is a dataset (an append, a reshard): lock lease, Ctrl-C, progress, failure.

The same steps as `build_shards.run` around `pipeline.run()`, as one function that takes the graph to
build, so every job that writes a dataset fails, is interrupted and cleans up the same way.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from . import options, progress
from .build_shards import LeaseKeeper, _remove_if_empty, abandon, raise_job_failure, still_running
from .config import BuildConfig


def execute(config: BuildConfig, opts: PipelineOptions, build: Callable[[beam.Pipeline], None], *,
            had_dataset: bool, created_output: bool = False, show_progress: bool | None = False):
    """Build the graph, run it and wait; returns the PipelineResult (None when only a template was written).

    A local run holds the output's lock with a lease and handles Ctrl-C; a failed run removes its temporary
    data and gives the lock back; a known failure is raised as its one-line error."""
    runner = opts.view_as(StandardOptions).runner or ""
    cloud = opts.view_as(GoogleCloudOptions)
    local = runner in options.LOCAL_RUNNERS
    interrupts = contextlib.nullcontext()
    if config.run_id is not None and local:
        from .interrupt import LocalInterrupts

        interrupts = LocalInterrupts(config, had_dataset=had_dataset)
    lease = LeaseKeeper(config.output, config.run_id) if config.run_id else contextlib.nullcontext()
    result = None
    try:
        with lease, interrupts, progress.showing(show_progress if local else False):
            pipeline = beam.Pipeline(options=opts)
            build(pipeline)
            result = pipeline.run()
            if cloud.template_location:
                print(f"tpu-shards: Dataflow template written to {cloud.template_location}")
                return None
            if local or show_progress is False:
                result.wait_until_finish()
            else:
                progress.watch(result, 30, project=cloud.project, region=cloud.region)
            raise_job_failure(result)
    except BaseException:
        if still_running(result):
            job = getattr(result, "job_id", lambda: "")()
            print(f"tpu-shards: stopped waiting; the job keeps running (gcloud dataflow jobs cancel {job} "
                  f"--region {cloud.region or 'REGION'} to stop it)", file=sys.stderr)
            raise
        if config.run_id is not None:
            abandon(config, config.run_id)
        if created_output:
            _remove_if_empty(config.output)
        raise
    return result
