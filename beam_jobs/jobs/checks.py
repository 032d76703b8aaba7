"""What a job checks before any work: its inputs, its output (taking the output's lock), its models and codecs,
and the Beam options it runs with. Shared by build, append and reshard."""
from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

from beam_jobs.errors import UsageError
from beam_jobs.jobs import options, running
from beam_jobs.jobs.beam_options import JobOptions
from beam_jobs.pipeline.listing_sources import prepare_listings
from beam_jobs.run import claim
from beam_jobs.run.config import BuildConfig
from shard_utils import inputs, storage
from shard_utils.text import printable

__all__ = [
    "LOCAL_RUNNER", "prepare_inputs", "check_listing_root", "check_input", "inside", "prepare_output",
    "check_models_and_codecs", "pipeline_options", "check_with_beam", "beam_logs_held", "check_runner"
]

LOCAL_RUNNER = "FnApiRunner"  # Beam's in-process runner; DirectRunner would first try to download Prism


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
        print(f"tpu-shards: {printable(note)}")
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
    try:  # one page of the top level, not the whole bucket: split folders are decided from what it shows
        files, folders, _ = storage.list_level(path, "", max_pages=1)
        if not files and not folders:
            raise UsageError(f"input {path} is empty" if not storage.is_gcs(path) else f"input {path} holds no objects")
        return inputs.has_split_dirs([f.rstrip("/") for f in folders])
    except storage.StorageError as exc:
        raise UsageError(f"cannot list input {path}: {exc.reason}") from None


def inside(path: str, folder: str) -> bool:
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
    if config.input is not None and inside(path, config.input):
        raise UsageError(f"output {path} is inside the input {config.input}; choose another place")
    if not storage.is_gcs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"output {path} exists and is not a folder")
    created = not storage.is_gcs(path) and not os.path.exists(path)
    try:
        storage.make_folder(path)
    except storage.StorageError as exc:
        raise UsageError(f"cannot create output folder {path}: {exc.reason}") from None
    try:
        content = claim.output_content(path)
    except storage.StorageError as exc:
        raise UsageError(f"cannot list output {path}: {exc.reason}") from None
    if content and not config.overwrite:
        raise UsageError(f"output {path} is not empty; pass --overwrite to replace the dataset there")
    if config.run_id is None:
        return created  # a template: the lock is taken when a launch runs
    try:
        claim.take(path, config.run_id, config.created or "")
    except storage.StorageError as exc:
        if created:
            running.remove_if_empty(path)
        raise UsageError(f"output {path} is not writable: {exc.reason}") from None
    claim.clear_leftovers(path, config.temp_root, config.run_id)
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
        from shard_utils.media.embed import EmbedError, check_model

        try:
            info = check_model(config.embed)
        except EmbedError as exc:
            raise UsageError(str(exc)) from None
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    return replace(config, embed_info=tuple(info.to_json().items()))


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options with the in-process runner as the local default; a UsageError in one line for a value Beam's
    parser refuses or a runner Beam does not know (`check_with_beam` runs Beam's validator, after a job's own
    checks)."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={LOCAL_RUNNER}")
    opts = JobOptions(args)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # argparse prints its usage block before exiting
            opts.get_all_options()
    except SystemExit:
        last = (said.getvalue().strip().splitlines() or ["a Beam option is not valid"])[-1]
        raise UsageError(last.split(" error: ", 1)[-1]) from None
    runner = opts.view_as(StandardOptions).runner or LOCAL_RUNNER
    check_runner(runner)
    if runner in options.LOCAL_RUNNERS:
        # Beam infers each step's element types from its function's bytecode as the graph is built (a third of
        # the graph's construction); an in-process run uses none of them. Remote runners keep them (coders).
        opts.view_as(TypeOptions).pipeline_type_check = False
    return opts


def check_with_beam(opts: PipelineOptions) -> None:
    """Beam's own checks of its options for the runner (a Dataflow project id, its region and temporary
    locations...), for a job to run after its own checks and before any work (Beam runs them when the pipeline
    is made): a UsageError naming everything Beam refused, in one line. Beam logs warnings about the same options while
    it checks: they are dropped when it refuses (the line says it) and shown when it accepts."""
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.runner import create_runner

    runner = create_runner(opts.view_as(StandardOptions).runner or LOCAL_RUNNER)
    with beam_logs_held() as held:
        errors = PipelineOptionsValidator(opts, runner).validate()
        if errors:
            held.clear()
            said = "; ".join(" ".join(e.split()).rstrip(".") for e in errors)
            raise UsageError(f"Beam refuses these options: {said}")


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def beam_logs_held() -> Iterator[list[logging.LogRecord]]:
    """Within the block, what Beam logs is kept in the list given, not shown; afterwards what is left in the
    list is shown as it would have been."""
    beam_logger = logging.getLogger("apache_beam")
    handler = _Held()
    propagated = beam_logger.propagate
    beam_logger.addHandler(handler)
    beam_logger.propagate = False
    try:
        yield handler.records
    finally:
        beam_logger.removeHandler(handler)
        beam_logger.propagate = propagated
        for record in handler.records:
            logging.getLogger(record.name).handle(record)


def check_runner(name: str) -> None:
    """A UsageError unless Beam knows the runner by name (or it is a dotted path to a runner class)."""
    if "." in name:
        return
    known = [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]
    if name.lower() in {k.lower() for k in known} or (name + "runner").lower() in {k.lower() for k in known}:
        return
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise UsageError(f"--runner {name}: not a Beam runner; {hint}this job runs on FnApiRunner (local, the default) "
                     "or DataflowRunner")
