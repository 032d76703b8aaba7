"""The main job: a folder or bucket of images in, balanced JPEG TFRecord shards and a manifest out.

    python -m beam_jobs.build_shards --input DIR --output DIR [options] [Beam pipeline options]

The graph reads like the data flow: list -> encode -> plan -> assign -> write -> publish.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import time
import uuid
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

import shard_utils
from shard_utils import inputs, manifest, storage
from shard_utils.images import DEFAULT_MAX_PIXELS, RESIZE_MODES, VALIDATE_MODES, ImageOptions
from shard_utils.plan import PlanError

from .config import BuildConfig
from .errors import UsageError
from .transforms import (AssignShards, EncodeImages, FinalizeDataset, ListMedia, PlanShards, WriteShards,
                         planning_failure)

LOCAL_RUNNER = "FnApiRunner"  # Beam's in-process runner; DirectRunner would first try to download Prism
TEMP_ROOT = ".tpu-shards-tmp"


def build_pipeline(p: beam.Pipeline, config: BuildConfig) -> None:
    """Add the whole job to a pipeline."""
    listed = p | "ListMedia" >> ListMedia(config)
    labels = (listed.media
              | "LabelOf" >> beam.Map(lambda m: m.label)
              | "DistinctLabels" >> beam.Distinct())
    encoded = listed.media | "EncodeImages" >> EncodeImages(config, labels)
    plans = encoded.records | "PlanShards" >> PlanShards(config)
    shards = (encoded.records
              | "AssignShards" >> AssignShards(plans)
              | "WriteShards" >> WriteShards(config, plans))
    rejected = (listed.rejected, encoded.rejected) | "AllRejected" >> beam.Flatten()
    _ = shards | "FinalizeDataset" >> FinalizeDataset(config, plans, rejected, listed.skipped, listed.seen, labels)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tpu-shards build",
        description="Build balanced, JPEG-encoded TFRecord shards for TPUs from a folder or gs:// bucket of images. "
                    "Unrecognised options are passed to Apache Beam (--runner, --direct_num_workers, ...).")
    ap.add_argument("--input", required=True, help="folder or gs://bucket/prefix holding <label>/<image> files")
    ap.add_argument("--output", required=True, help="folder or gs://bucket/prefix for shards and manifest.json")
    ap.add_argument("--splits", help="e.g. train=0.9,validation=0.1 (default: all in train, or the input's "
                                     "train/validation/test folders)")
    ap.add_argument("--image-size", help="H or H,W: resize every image (default: keep sizes)")
    ap.add_argument("--resize", choices=RESIZE_MODES, default="fill",
                    help="fill: cover then centre-crop to exactly HxW (default); stretch: exactly HxW; "
                         "fit: inside HxW keeping aspect")
    ap.add_argument("--jpeg-quality", type=int, default=95, help="JPEG quality 1-100 for re-encoded images")
    ap.add_argument("--num-cores", type=int, default=8, help="TPU cores per host (default 8)")
    ap.add_argument("--num-hosts", type=int, default=1, help="TPU hosts reading the data (default 1)")
    ap.add_argument("--target-shard-mb", type=float, default=128.0, help="aim for shards of this size (MB, 10^6)")
    ap.add_argument("--num-shards", type=int, help="force this many shards per split (a multiple of cores x hosts)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split assignment and record order")
    ap.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                    help=f"reject images with more pixels, without decoding them (default {DEFAULT_MAX_PIXELS})")
    ap.add_argument("--validate", choices=VALIDATE_MODES, default="decode",
                    help="how JPEGs kept byte for byte are checked: decode (every byte decoded, default) or "
                         "structure (header and end marker only: about 3x faster, misses damage inside the data)")
    ap.add_argument("--background", default="255,255,255", help="R,G,B behind transparent pixels (default white)")
    ap.add_argument("--overwrite", action="store_true", help="replace the dataset already in --output")
    return ap


def _int_list(text: str, what: str, count: tuple[int, ...], low: int, high: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in count or not all(low <= v <= high for v in values):
        raise UsageError(f"{what} {text!r} must be {' or '.join(map(str, count))} integers in {low}..{high}")
    return values


def make_config(args: argparse.Namespace, split_dirs: bool) -> BuildConfig:
    """Check the options and turn them into a BuildConfig; raises UsageError with the option named."""
    if args.splits and split_dirs:
        raise UsageError("the input already has train/validation/test folders; drop --splits")
    try:
        splits = inputs.parse_splits(args.splits) if args.splits else [("train", 1.0)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    size = None
    if args.image_size:
        hw = _int_list(args.image_size, "--image-size", (1, 2), 1, 65535)
        size = (hw[0], hw[-1])
    if not 1 <= args.jpeg_quality <= 100:
        raise UsageError(f"--jpeg-quality {args.jpeg_quality} must be in 1..100")
    for name in ("num_cores", "num_hosts"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    unit = args.num_cores * args.num_hosts
    if args.num_shards is not None and (args.num_shards < 1 or args.num_shards % unit):
        raise UsageError(f"--num-shards {args.num_shards} must be a positive multiple of num_cores x num_hosts = {unit}")
    if not args.target_shard_mb > 0:
        raise UsageError("--target-shard-mb must be positive")
    if args.max_pixels < 1:
        raise UsageError("--max-pixels must be positive")
    background = _int_list(args.background, "--background", (3,), 0, 255)
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = now.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    return BuildConfig(
        input=args.input, output=args.output, temp_dir=storage.join(args.output, TEMP_ROOT, run_id),
        splits=splits, split_dirs=split_dirs,
        image=ImageOptions(size=size, resize=args.resize, quality=args.jpeg_quality, max_pixels=args.max_pixels,
                           background=background, validate=args.validate),
        num_cores=args.num_cores, num_hosts=args.num_hosts, target_shard_mb=args.target_shard_mb,
        num_shards=args.num_shards, seed=args.seed, tool_version=shard_utils.__version__,
        created=now.isoformat(timespec="seconds"))


def check_input(path: str) -> bool:
    """Refuse a missing or empty input; return whether it is laid out in split folders."""
    if storage.is_gcs(path):
        _gcs_uri(path, "input")
        try:
            first = next(iter(storage.walk(path)), None)  # one page of the listing, not the whole bucket
            split_dirs = inputs.has_split_dirs(storage.top_level_dirs(path)) if first is not None else False
        except Exception as exc:
            raise UsageError(f"cannot list input {path}: {storage.gcs_problem(exc, path)}") from None
        if first is None:
            raise UsageError(f"input {path} holds no objects")
        return split_dirs
    else:
        if not os.path.exists(path):
            raise UsageError(f"input folder {path} does not exist")
        if not os.path.isdir(path):
            raise UsageError(f"input {path} is not a folder")
        try:
            empty = not any(True for _ in os.scandir(path))
        except OSError as exc:
            raise UsageError(f"cannot read input folder {path}: {exc.strerror}") from None
        if empty:
            raise UsageError(f"input folder {path} is empty")
    return inputs.has_split_dirs(storage.top_level_dirs(path))


def prepare_output(path: str, input_path: str, overwrite: bool) -> bool:
    """Refuse an unusable output before any work; return whether this run created the folder."""
    if storage.is_gcs(path):
        _gcs_uri(path, "output")
        if storage.is_gcs(input_path) and _inside(path, input_path):
            raise UsageError(f"output {path} is inside the input {input_path}; choose another place")
        try:
            names = storage.list_names(path)
        except Exception as exc:
            raise UsageError(f"cannot list output {path}: {storage.gcs_problem(exc, path)}") from None
        created = False
    else:
        if not storage.is_gcs(input_path):
            real_in, real_out = os.path.realpath(input_path), os.path.realpath(path)
            if os.path.commonpath([real_in, real_out]) == real_in:
                raise UsageError(f"output {path} is inside the input folder {input_path}; choose another place")
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"output {path} exists and is not a folder")
        created = not os.path.exists(path)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create output folder {path}: {exc.strerror}") from None
        names = os.listdir(path)
    if names and not overwrite:
        raise UsageError(f"output {path} is not empty; pass --overwrite to replace the dataset there")
    probe = storage.join(path, TEMP_ROOT + "-probe")
    try:
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except Exception as exc:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        cause = exc.__cause__ if isinstance(exc, storage.StorageError) and exc.__cause__ else exc
        why = storage.gcs_problem(cause, path) if storage.is_gcs(path) else storage._short(exc)
        raise UsageError(f"output {path} is not writable: {why}") from None
    remove_temp(storage.join(path, TEMP_ROOT))
    return created


def remove_temp(folder: str) -> None:
    """Delete a temporary folder of this or an earlier, interrupted run."""
    if storage.is_gcs(folder):
        from apache_beam.io.filesystems import FileSystems

        # Buckets have no folders: a trailing "/" makes Beam remove every object under the prefix
        # (fragments, unpublished shards), in retried batches; nothing there is not an error.
        try:
            FileSystems.delete([folder.rstrip("/") + "/"])
        except Exception as exc:  # leftovers are hidden and removed by the next run; not worth failing for
            print(f"tpu-shards: warning: temporary objects under {folder} not removed: "
                  f"{storage.gcs_problem(exc, folder)}", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)


def _gcs_uri(path: str, what: str) -> None:
    try:
        storage.split_gcs(path)
    except storage.StorageError as exc:
        raise UsageError(f"{what}: {exc}") from None


def _inside(path: str, folder: str) -> bool:
    """Whether gs:// path is folder or lies under it."""
    return (path.rstrip("/") + "/").startswith(folder.rstrip("/") + "/")


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options with the in-process runner as the local default."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={LOCAL_RUNNER}")
    unknown = [a for a in args if a.startswith("--") and a.split("=")[0] in ("--input_dir", "--output_dir")]
    if unknown:
        raise UsageError(f"unknown option {unknown[0]}; did you mean --input/--output?")
    return PipelineOptions(args)


def run(argv: Sequence[str] | None = None) -> manifest.Manifest | None:
    """Run the job; returns the manifest written (None when only a Dataflow template was created)."""
    args, beam_args = parser().parse_known_args(argv)
    options = pipeline_options(beam_args)
    split_dirs = check_input(args.input)
    config = make_config(args, split_dirs)
    created = prepare_output(args.output, args.input, args.overwrite)
    template = options.view_as(GoogleCloudOptions).template_location
    runner = options.view_as(StandardOptions).runner or ""
    started = time.monotonic()
    result = None
    try:
        pipeline = beam.Pipeline(options=options)
        build_pipeline(pipeline, config)
        result = pipeline.run()
        if template:
            print(f"tpu-shards: Dataflow template written to {template}")
            return None
        result.wait_until_finish()
        failure = planning_failure(config.temp_dir)
        if failure:
            raise PlanError(failure)
    except BaseException:
        if still_running(result):
            # Ctrl-C while waiting for Dataflow: the job goes on and needs its temporary objects.
            job = getattr(result, "job_id", lambda: "")()
            print(f"tpu-shards: stopped waiting; the job keeps running (gcloud dataflow jobs cancel {job} "
                  "to stop it)", file=sys.stderr)
            raise
        remove_temp(storage.join(args.output, TEMP_ROOT))
        if created and not storage.is_gcs(args.output) and not os.listdir(args.output):
            os.rmdir(args.output)
        raise
    built = manifest.load(args.output)
    print(summary(built, time.monotonic() - started, runner))
    counters = metrics_summary(result)
    if counters:
        print(counters)
    return built


def still_running(result) -> bool:
    """Whether a job may still be running after the driver stopped waiting (a remote runner, interrupted)."""
    if result is None:  # the in-process runner returns only when the job is over
        return False
    from apache_beam.runners.runner import PipelineState

    try:
        return not PipelineState.is_terminal(result.state)
    except Exception:  # state unknown: do not delete what a running job may need
        return True


COUNTER_ORDER = ("files_matched", "images_written", "shards_written", "bytes_written",
                 "images_passed_through", "images_reencoded")


def counter_totals(result) -> dict[str, int]:
    """The job's Beam counters (namespace tpu_shards), summed over steps; empty if the runner has none."""
    from apache_beam.metrics.metric import MetricsFilter

    from .transforms import NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception:  # a runner without metrics support must not fail a finished build
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


def summary(m: manifest.Manifest, seconds: float, runner: str) -> str:
    """A few lines a person reads at the end of a local run."""
    lines = [f"tpu-shards: wrote {m.location} in {seconds:.1f}s ({runner})"]
    for name, split in m.splits.items():
        sizes = sorted({s.num_records for s in split.shards})
        lines.append(f"  {name}: {split.num_records} records in {len(split.shards)} shards "
                     f"of {'/'.join(map(str, sizes))} records, {split.num_bytes / 1e6:.1f} MB")
    def reasons(part: dict) -> str:
        return f" ({', '.join(f'{k} {v}' for k, v in part.get('by_reason', {}).items())})" if part["count"] else ""

    lines.append(f"  files seen {m.files_seen}: rejected {m.rejected['count']}{reasons(m.rejected)}, "
                 f"skipped {m.skipped['count']}{reasons(m.skipped)}")
    if m.rejected["count"]:
        lines.append(f"  see {storage.join(m.location, m.rejected['path'])} for why each file was rejected")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import guarded

    return guarded(run, argv)


if __name__ == "__main__":
    sys.exit(main())
