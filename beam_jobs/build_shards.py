"""The main job: a folder or bucket of images in, balanced JPEG TFRecord shards and a manifest out.

    python -m beam_jobs.build_shards --input DIR --output DIR [options] [Beam pipeline options]

The graph reads like the data flow: list -> encode -> plan -> write -> publish.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import replace
import sys
import time
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (DirectOptions, GoogleCloudOptions, PipelineOptions,
                                                  StandardOptions)

from shard_utils import inputs, manifest, runlock, storage
from shard_utils.sharding.naming import ShardNaming

from beam_jobs import options, publish, running
from beam_jobs.config import BuildConfig
from beam_jobs.errors import UsageError
from beam_jobs.listing_io import prepare_listings
from beam_jobs.pipeline.dataset import ShardMedia
from beam_jobs.pipeline.listing import ListListedMedia, ListMedia
from beam_jobs.pipeline.publish import Publish
from beam_jobs.pipeline.start import KeepLease, StartRun, new_run_id

LOCAL_RUNNER = "FnApiRunner"  # Beam's in-process runner; DirectRunner would first try to download Prism


def build_pipeline(p: beam.Pipeline, config: BuildConfig) -> None:
    """Add the whole job to a pipeline: the same steps on every runner (see `beam_jobs.pipeline`)."""
    run = p | "StartRun" >> StartRun(config)  # RunInfo
    if config.run_id is None:  # a template launch: no driver renews the lock
        _ = run | "KeepLease" >> KeepLease(config)
    lister = ListListedMedia(config) if config.uses_listing else ListMedia(config)
    listed = p | "ListMedia" >> lister  # media: [MediaItem] chunks; rejected; skipped_files; tally; labels
    sharded = listed["media"] | "ShardMedia" >> ShardMedia(config, listed["labels"], run,
                                                           ShardNaming.for_build(config.shard_extension))
    rejected = (listed["rejected"], sharded["rejected"]) | "AllRejected" >> beam.Flatten()  # dicts
    _ = {"shards": sharded["shards"], "plans": sharded["plans"], "failure": sharded["failure"], "rejected": rejected,
         "skipped_files": listed["skipped_files"], "tally": listed["tally"], "labels": listed["labels"], "run": run,
         "cross_split": sharded["cross_split"]} | "Publish" >> Publish(config)


def prepare_inputs(args):
    """The listing options (listings checked and expanded) and whether the input holds split folders;
    prints the listing's notes."""
    listing = options.listing_options(args)
    if not listing.listings:
        return listing, check_input(args.input)
    check_listing_root(args.input)
    try:
        listing, notes = prepare_listings(listing)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for note in notes:
        print(f"tpu-shards: {note}")
    return listing, False


def check_listing_root(path: str | None) -> None:
    """With a listing, --input is only the folder relative paths are under: it must exist, it is not walked."""
    if path is None or storage.is_gcs(path):
        return
    if not os.path.isdir(path):
        raise UsageError(f"input folder {path} does not exist" if not os.path.exists(path) else
                         f"input {path} is not a folder")


def check_input(path: str) -> bool:
    """Refuse a missing or empty input; return whether it is laid out in split folders."""
    try:
        storage.split_gcs(path) if storage.is_gcs(path) else None
    except storage.StorageError as exc:
        raise UsageError(f"input: {exc}") from None
    if not storage.is_gcs(path):
        if not os.path.exists(path):
            raise UsageError(f"input folder {path} does not exist")
        if not os.path.isdir(path):
            raise UsageError(f"input {path} is not a folder")
    try:
        first = next(iter(storage.walk(path)), None)  # one page of the listing, not the whole bucket
        if first is None:
            raise UsageError(f"input {path} is empty" if not storage.is_gcs(path) else f"input {path} holds no objects")
        return inputs.has_split_dirs(storage.top_level_dirs(path))
    except storage.StorageError as exc:
        raise UsageError(f"cannot list input {path}: {exc.reason}") from None


def _inside(path: str, folder: str) -> bool:
    """Whether path is folder or lies under it (gs:// URIs, or real local paths)."""
    if storage.is_gcs(path) != storage.is_gcs(folder):
        return False
    if storage.is_gcs(path):
        return (path.rstrip("/") + "/").startswith(folder.rstrip("/") + "/")
    real_in, real_out = os.path.realpath(folder), os.path.realpath(path)
    return os.path.commonpath([real_in, real_out]) == real_in


def prepare_output(config: BuildConfig) -> bool:
    """Refuse an unusable or busy output before any work, and take its lock; returns whether the folder was
    made by this run. Temporary folders of dead earlier runs are removed once the lock is ours."""
    path = config.output
    if storage.is_gcs(path):
        try:
            storage.split_gcs(path)
        except storage.StorageError as exc:
            raise UsageError(f"output: {exc}") from None
    if config.input is not None and _inside(path, config.input):
        raise UsageError(f"output {path} is inside the input {config.input}; choose another place")
    if not storage.is_gcs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"output {path} exists and is not a folder")
    created = not storage.is_gcs(path) and not os.path.exists(path)
    try:
        storage.make_folder(path)
    except storage.StorageError as exc:
        raise UsageError(f"cannot create output folder {path}: {exc.reason}") from None
    try:
        content = publish.output_content(path)
    except storage.StorageError as exc:
        raise UsageError(f"cannot list output {path}: {exc.reason}") from None
    if content and not config.overwrite:
        raise UsageError(f"output {path} is not empty; pass --overwrite to replace the dataset there")
    if config.run_id is None:
        return created  # a template: the lock is taken when a launch runs
    try:
        runlock.acquire(path, config.run_id, config.created or "")
    except runlock.OutputBusy as exc:
        raise UsageError(str(exc)) from None
    except storage.StorageError as exc:
        if created:
            running.remove_if_empty(path)
        raise UsageError(f"output {path} is not writable: {exc.reason}") from None
    publish.clean_stale_runs(config.temp_root, config.run_id)
    return created


def check_models_and_codecs(config: BuildConfig) -> BuildConfig:
    """Before any work: video needs PyAV; an embedding model must load and answer a probe (its identity goes
    into the manifest). One line when not."""
    from shard_utils.extras import MissingExtra, require

    try:
        if config.video is not None:
            require("av", "video", "video clips (--video-frames)")
        if config.embed is None:
            return config
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter is not for users
        require("tensorflow", "embed", "--embed-model")
        from shard_utils.embed import EmbedError, check_model

        try:
            info = check_model(config.embed)
        except EmbedError as exc:
            raise UsageError(str(exc)) from None
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    return replace(config, embed_info=tuple(info.to_json().items()))


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options with the in-process runner as the local default."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={LOCAL_RUNNER}")
    return PipelineOptions(args)


def run(argv: Sequence[str] | None = None) -> manifest.Manifest | None:
    """Run the job; returns the manifest written (None when only a Dataflow template was created)."""
    args, beam_args = options.parse(list(sys.argv[1:] if argv is None else argv))
    if args.append:
        from beam_jobs.append import run_append

        return run_append(args, beam_args)
    opts = pipeline_options(beam_args)
    runner = opts.view_as(StandardOptions).runner or ""
    direct = opts.view_as(DirectOptions)
    cloud = opts.view_as(GoogleCloudOptions)
    workers = options.local_workers(args.workers, runner, direct.direct_num_workers or 1,
                                    direct.direct_running_mode or "", options.available_cores())
    listing, split_dirs = prepare_inputs(args)
    template = cloud.template_location
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = None if template else new_run_id(now)  # a template decides its run when launched
    config = options.make_config(
        args, split_dirs, workers=workers, temp_root=publish.temp_root_for(args.output, cloud.temp_location),
        run_id=run_id, created=None if template else now.isoformat(timespec="seconds"), listing=listing,
        local=runner in options.LOCAL_RUNNERS and not template)
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
        print(summary(built, time.monotonic() - started, runner, workers))
        counters = metrics_summary(result)
        if counters:
            print(counters)
    return built


COUNTER_ORDER = ("files_matched", "images_written", "shards_written", "bytes_written",
                 "images_passed_through", "images_reencoded", "jpeg_trailers_dropped", "fragment_bytes_read",
                 "shard_bytes_copied")


def counter_totals(result) -> dict[str, int]:
    """The job's Beam counters (namespace tpu_shards), summed over steps; empty if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    from beam_jobs.pipeline.common import NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception:  # noqa: BLE001 - a runner without metrics support must not fail a finished build
        return {}
    totals: dict[str, int] = {}
    for c in found:
        value = c.committed if c.committed is not None else c.attempted
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(value or 0)
    return totals


def metrics_summary(result) -> str:
    """One line of the job's Beam counters: files matched, images and bytes written, rejects by reason."""
    totals = counter_totals(result)
    names = [n for n in COUNTER_ORDER if n in totals] + sorted(n for n in totals if n not in COUNTER_ORDER)
    return ("  counters: " + ", ".join(f"{n} {totals[n]}" for n in names)) if names else ""


def summary(m: manifest.Manifest, seconds: float, runner: str, workers: int = 1) -> str:
    """A few lines a person reads at the end of a local run."""
    how = f"{runner}, {workers} encode processes" if workers > 1 else runner
    lines = [f"tpu-shards: wrote {m.location} in {seconds:.1f}s ({how})"]
    for name, split in m.splits.items():
        sizes = sorted({s.num_records for s in split.shards})
        lines.append(f"  {name}: {split.num_records} records in {len(split.shards)} shards "
                     f"of {'/'.join(map(str, sizes))} records, {split.num_bytes / 1e6:.1f} MB")

    def reasons(part: dict) -> str:
        return f" ({', '.join(f'{k} {v}' for k, v in part.get('by_reason', {}).items())})" if part["count"] else ""

    extensions = m.skipped.get("by_extension") or {}
    not_media = f"; not media: {', '.join(f'{k} {v}' for k, v in extensions.items())}" if extensions else ""
    lines.append(f"  files seen {m.files_seen}: rejected {m.rejected['count']}{reasons(m.rejected)}, "
                 f"skipped {m.skipped['count']}{reasons(m.skipped)}{not_media}")
    if m.rejected["count"]:
        lines.append(f"  see {storage.join(m.location, m.rejected['path'])} for why each file was rejected")
    if m.skipped.get("path"):
        lines.append(f"  skipped files are listed in {storage.join(m.location, m.skipped['path'])}")
    cross = (m.duplicates or {}).get("cross_split") or {}
    if cross:
        pairs = ", ".join(f"{pair.replace('|', '/')} {n}" for pair, n in cross.items())
        lines.append(f"  warning: {sum(cross.values())} duplicate files were in two splits ({pairs}): the same image "
                     "in training and evaluation data; each was kept once")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from beam_jobs.cli import guarded

    return guarded(run, argv)


if __name__ == "__main__":
    from beam_jobs.cli import exit_now

    exit_now(main())
