"""The main job: a folder or bucket of images in, balanced JPEG TFRecord shards and a manifest out.

    tpu-shards build --input DIR --output DIR [options] [Beam pipeline options]

The graph reads like the data flow: list -> encode -> plan -> write -> publish.
"""
from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, StandardOptions

from beam_jobs.jobs import options, running
from beam_jobs.jobs.checks import (
    check_models_and_codecs,
    check_with_beam,
    pipeline_options,
    prepare_inputs,
    prepare_output,
)
from beam_jobs.jobs.summary import metrics_summary, summary
from beam_jobs.pipeline.dataset import ShardMedia
from beam_jobs.pipeline.listing import ListListedMedia, ListMedia
from beam_jobs.pipeline.publish import Publish
from beam_jobs.pipeline.start import StartRun
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig
from beam_jobs.run.identity import new_run_id
from shard_utils.format import manifest
from shard_utils.sharding.naming import ShardNaming
from shard_utils.text import printable_lines

__all__ = ["build_pipeline", "run", "main"]


def build_pipeline(p: beam.Pipeline, config: BuildConfig) -> None:
    """Add the whole job to a pipeline: the same steps on every runner (see `beam_jobs.pipeline`)."""
    run = p | "StartRun" >> StartRun(config)  # RunInfo (a template launch: decided here, its lease kept by the job)
    lister = ListListedMedia(config) if config.uses_listing else ListMedia(config)
    listed = p | "ListMedia" >> lister  # media: [MediaItem] chunks; rejected; skipped_files; tally; labels
    sharded = listed["media"] | "ShardMedia" >> ShardMedia(config, listed["labels"], run,
                                                           ShardNaming.for_build(config.shard_extension))
    rejected = (listed["rejected"], sharded["rejected"]) | "AllRejected" >> beam.Flatten()  # dicts
    _ = {"shards": sharded["shards"], "plans": sharded["plans"], "failure": sharded["failure"], "rejected": rejected,
         "skipped_files": listed["skipped_files"], "tally": listed["tally"], "labels": listed["labels"], "run": run,
         "cross_split": sharded["cross_split"], "quality": sharded["quality"]} | "Publish" >> Publish(config)


def run(argv: Sequence[str] | None = None) -> manifest.Manifest | None:
    """Run the job; returns the manifest written (None when only a Dataflow template was created)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args = options.parse(argv)
    if args.append:
        from beam_jobs.jobs.append import run_append

        return run_append(args, beam_args, options.given(argv))
    opts = pipeline_options(beam_args)
    runner = opts.view_as(StandardOptions).runner or ""
    direct = opts.view_as(DirectOptions)
    cloud = opts.view_as(GoogleCloudOptions)
    workers = options.build_workers(args, runner, direct)
    listing, split_dirs = prepare_inputs(args)
    template = cloud.template_location
    now = datetime.datetime.now(datetime.UTC)
    run_id = None if template else new_run_id(now)  # a template decides its run when launched
    config = options.make_config(
        args, split_dirs, workers=workers, temp_root=claim.temp_root_for(args.output, cloud.temp_location),
        run_id=run_id, created=None if template else now.isoformat(timespec="seconds"), listing=listing,
        local=runner in options.LOCAL_RUNNERS and not template)
    check_with_beam(opts)
    config = check_models_and_codecs(config)
    local = runner in options.LOCAL_RUNNERS
    with running.guard_interrupts(config, local):  # from the lock on, Ctrl-C says what state the output is in
        created = prepare_output(config)
        started = time.monotonic()
        result = running.execute(config, opts, lambda p: build_pipeline(p, config), created_output=created,
                                 show_progress=args.progress)
        if result is None:  # a template was written
            return None
        built = manifest.load(args.output)
        print(printable_lines(summary(built, time.monotonic() - started, runner, workers)))
        counters = metrics_summary(result)
        if counters:
            print(counters)
    return built


def main(argv: Sequence[str] | None = None) -> int:
    from beam_jobs.errors import guarded

    return guarded(run, argv)


if __name__ == "__main__":
    from beam_jobs.errors import exit_now

    exit_now(main())
