"""The build's command-line options: the parser, their checks, and the BuildConfig they make.

Every option is checked: a value out of range, an unknown option (ours or Beam's) or a misspelling
is one line naming it, with the closest option when there is one. Underscore spellings of our own
options (what Beam users type: --image_size) are accepted as aliases.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import shard_utils
from beam_jobs import progress
from beam_jobs.errors import OneLineParser, UsageError, unknown_option
from beam_jobs.pipeline import listing_sources as listing_io
from beam_jobs.run.config import BuildConfig, RejectLimit
from shard_utils import inputs, storage
from shard_utils.format import names, schema, topology
from shard_utils.format.image_size import parse_image_size
from shard_utils.format.json_values import MAX_INT
from shard_utils.format.shard_formats import OPTIONS, TFRECORD, formats_of, get
from shard_utils.inputs import listings
from shard_utils.media.budget import DEFAULT_WORKER_MEMORY, largest_image, mib
from shard_utils.media.embed import DEFAULT_BATCH_SIZE, PREPROCESS_MODES
from shard_utils.media.images import DEFAULT_MAX_PIXELS, RESIZE_MODES, VALIDATE_MODES, ImageOptions
from shard_utils.media.reads import DEFAULT_MAX_FILE_BYTES
from shard_utils.quality.cluster_actions import MODES as NEAR_DUP_MODES
from shard_utils.sharding import plan
from shard_utils.sharding.runs import CHUNK_BYTES

__all__ = [
    "LOCAL_RUNNERS", "DEFAULT_MAX_REJECTED", "parser", "described_options", "MAX_DESCRIBED", "described", "normalise",
    "given", "beam_option_strings", "beam_option_values", "check_beam_args", "parse", "check_job_path", "reject_limit",
    "available_cores", "available_memory", "worker_memory", "build_workers", "local_workers", "listing_options",
    "video_options", "embed_key", "embed_spec", "check_seed", "check_format", "tpu_layout", "check_stratify",
    "make_config"
]

LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
DEFAULT_MAX_REJECTED = "50%"  # (the help text doubles the % for argparse)


def parser() -> OneLineParser:
    """The build's own options (Beam's are passed through and checked separately)."""
    ap = OneLineParser(
        prog="tpu-shards build", allow_abbrev=False,
        description="Build balanced, JPEG-encoded TFRecord shards for TPUs from a folder or gs:// bucket of images. "
                    "Beam's own options (--runner, --direct_num_workers, Dataflow options) are passed to Beam.")
    ap.add_argument("--input", help="folder or gs://bucket/prefix holding <label>/<image> files (with --listing: "
                                    "the folder its relative paths are under)")
    ap.add_argument("--output", required=True, help="folder or gs://bucket/prefix for shards and manifest.json")
    ap.add_argument("--splits", help="e.g. train=0.9,validation=0.1 (default: all in train, or the input's "
                                     "train/validation/test folders)")
    ap.add_argument("--stratify", action="store_true",
                    help="cut each class into the --splits at their fractions (every split's count of a class within "
                         "one of its fraction), instead of each file by its own hash")
    ap.add_argument("--image-size", help="H or H,W: resize every image (default: keep sizes)")
    ap.add_argument("--resize", choices=RESIZE_MODES, default="fill",
                    help="fill: cover then centre-crop to exactly HxW (default); stretch: exactly HxW; "
                         "fit: inside HxW keeping aspect")
    ap.add_argument("--jpeg-quality", type=int, default=95, help="JPEG quality 1-100 for re-encoded images")
    ap.add_argument("--tpu", help="the TPU slice the data is for, by accelerator type (e.g. v4-32, v5e-16): sets "
                                  "--num-cores and --num-hosts from its devices per host and hosts")
    ap.add_argument("--num-cores", type=int, help="TPU cores (devices) per host (default 8)")
    ap.add_argument("--num-hosts", type=int, help="TPU hosts reading the data (default 1)")
    ap.add_argument("--target-shard-mb", type=float, default=128.0, help="aim for shards of this size (MB, 10^6)")
    ap.add_argument("--num-shards", type=int, help="force this many shards per split (a multiple of cores x hosts)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split assignment and record order")
    ap.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                    help=f"reject images with more pixels, without decoding them (default {DEFAULT_MAX_PIXELS})")
    ap.add_argument("--validate", choices=VALIDATE_MODES, default="decode",
                    help="how JPEGs kept byte for byte are checked: decode (every byte decoded at 1/8 scale, default) "
                         "or structure (the marker structure only: faster, misses damage inside the data)")
    ap.add_argument("--quality-checks", choices=("on", "off"), default="on",
                    help="on (default): each image's perceptual signature (in the index) and flags (small, aspect, "
                         "blur, exposure, grayscale) in quality.jsonl and the manifest; off: neither")
    ap.add_argument("--background", default="255,255,255", help="R,G,B behind transparent pixels (default white)")
    ap.add_argument("--max-rejected", default=DEFAULT_MAX_REJECTED,
                    help="fail the build (nothing published) when more files than this are rejected: a count "
                         f"(e.g. 0) or a percentage of the files seen (e.g. 5%%); default {DEFAULT_MAX_REJECTED}%")
    ap.add_argument("--label-offset", type=int, default=0,
                    help="store label id + N (e.g. 1 for readers with 1-based labels, such as the tensorflow/tpu "
                         "ResNet parser); recorded in the manifest, and the loader subtracts it back")
    ap.add_argument("--shard-extension", choices=TFRECORD.extensions, default=TFRECORD.extensions[0],
                    help="shard file extension: tfrecord (default) or tfrec (what Kaggle's TPU notebooks glob)")
    ap.add_argument("--format", choices=OPTIONS, default=TFRECORD.name,
                    help="shards to publish: tfrecord (default), array_record (Grain's random-access format; needs "
                         "the array_record extra) or both, from one pass over the media: the same records in the same "
                         "order and balance")
    ap.add_argument("--workers", type=int,
                    help="local builds: processes that encode images (default and most: one per core this process "
                         "may use, and no more than the free memory holds at --worker-memory-mb each). Refused "
                         "above 1 on Dataflow, where each vCPU already runs its own worker process")
    ap.add_argument("--worker-memory-mb", type=int, default=DEFAULT_WORKER_MEMORY >> 20,
                    help="memory one worker may spend on one image; an image whose header says it needs more is "
                         f"rejected too_large (default and least {DEFAULT_WORKER_MEMORY >> 20}; see docs/images.md)")
    ap.add_argument("--dedup", action="store_true",
                    help="keep files with identical bytes once (the smallest source id); the others are rejected "
                         "'duplicate', and duplicates across splits are counted in the manifest (off by default: it "
                         "shuffles every record's hash, and identical files may be meant, e.g. under two labels)")
    ap.add_argument("--near-dups", choices=NEAR_DUP_MODES, default="report",
                    help="near-duplicates (the same picture resized, re-compressed or slightly cropped, found by a "
                         "perceptual signature): report lists their clusters in quality.jsonl (default); group also "
                         "keeps each cluster inside one split (its kept member's); drop keeps one record per cluster "
                         "(the smallest source id) and rejects the others 'near_duplicate'")
    ap.add_argument("--follow-symlinks", action="store_true",
                    help="follow symbolic links to files wherever they point (default: links are rejected); links "
                         "that dangle, loop or point at folders are still rejected")
    ap.add_argument("--overwrite", action="store_true", help="replace the dataset already in --output")
    ap.add_argument("--append", action="store_true",
                    help="add the files not yet in the dataset at --output as a new generation of shards; existing "
                         "shards are kept byte for byte, but a split's latest generation is written again with new "
                         "records too few for shards of their own (give the first build's options again)")
    progress.add_argument(ap)
    listings.add_arguments(ap)
    described = ap.add_argument_group("dataset description (croissant.json and the README.md card)")
    for flag, text in described_options():
        described.add_argument(f"--{flag}", help=text)
    clips = ap.add_argument_group("video clips")
    clips.add_argument("--video-frames", type=int, help="build a dataset of video clips (.mp4 .mov .webm .mkv .avi): "
                                                       "N frames sampled evenly over each clip, one record per clip")
    clips.add_argument("--video-fps", type=float, help="with --video-frames N: the first N frames at this rate instead")
    model = ap.add_argument_group("embeddings")
    model.add_argument("--embed-model", help="a Keras .keras file or a TensorFlow SavedModel folder (local or gs://) "
                                             "run on every image (every frame of a clip); needs TensorFlow: "
                                             "pip install -e '.[embed]' in a checkout")
    model.add_argument("--embed-preprocess", choices=PREPROCESS_MODES,
                       help="how pixels 0..255 are scaled for the model: scale01, minus1to1, imagenet (torchvision "
                            "mean/std) or none; required with --embed-model")
    model.add_argument("--embed-input-size", help="H,W the model takes (default: from its input signature)")
    model.add_argument("--embed-batch-size", type=int,
                       help=f"images per model call (default {DEFAULT_BATCH_SIZE})")
    model.add_argument("--embed-key",
                       help=f"the feature holding the embedding (default {schema.EMBEDDING})")
    model.add_argument("--embed-output", help="the model output to use, for a model with several")
    ap.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_BYTES / 2**20,
                    help=f"reject source files larger than this (MiB, default {DEFAULT_MAX_FILE_BYTES // 2**20}) as "
                         "too_large, without reading them")
    # Internal sizes, for tests and benchmarks that exercise many buckets or many run parts on small data.
    ap.add_argument("--hash-bucket-bits", type=int, default=plan.DEFAULT_BUCKET_BITS, help=argparse.SUPPRESS)
    ap.add_argument("--run-part-mb", type=float, default=CHUNK_BYTES / 2**20, help=argparse.SUPPRESS)
    return ap


def described_options() -> list[tuple[str, str]]:
    """The options that describe the dataset (recorded in the manifest, written to croissant.json and the card)."""
    return [("name", "the dataset's name (default: the output folder's name)"),
            ("description", "one paragraph on what the dataset holds (default: a summary of its counts)"),
            ("license", "its licence: an SPDX id (e.g. cc-by-4.0) or a URL"),
            ("citation", "how to cite it (e.g. a BibTeX entry)"),
            ("url", "its home page (http:// or https://)")]


MAX_DESCRIBED = {"name": 200, "license": 2000, "url": 2000, "description": 20000, "citation": 20000}


def described(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The given description options, checked: bounded, printable, a URL for --url (UsageError otherwise)."""
    given = []
    for flag, _ in described_options():
        value = getattr(args, flag, None)
        if value is None:
            continue
        multi_line = flag in ("description", "citation")
        if not value.strip() or len(value) > MAX_DESCRIBED[flag] or any(
                ord(c) < 32 and not (multi_line and c in "\n\t") for c in value):
            raise UsageError(f"--{flag} must be non-empty printable text of at most {MAX_DESCRIBED[flag]} characters"
                             + ("" if multi_line else " on one line"))
        if flag == "url" and not value.startswith(("https://", "http://")):
            raise UsageError(f"--url {names.shown(value)} must start with https:// or http://")
        given.append((flag, value.strip()))
    return tuple(given)


def normalise(argv: Sequence[str], ours: Sequence[str]) -> list[str]:
    """Rewrite underscore spellings of our own options (--image_size) to the dashed form (--image-size)."""
    dashed = {"--" + o[2:].replace("-", "_"): o for o in ours if "-" in o[2:]}
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        out.append(dashed[name] + eq + value if name in dashed else arg)
    return out


def given(argv: Sequence[str]) -> set[str]:
    """The build options (their dests) a command line gives; the others are at their defaults."""
    from beam_jobs.jobs.inherit import given_options

    ap = parser()
    return given_options(ap, normalise(argv, ap.option_names()))


def beam_option_strings() -> set[str]:
    """Every option string Beam's PipelineOptions classes define (what Beam would not drop as unparseable)."""
    return set(beam_option_values())


def beam_option_values() -> dict[str, bool]:
    """Every option string Beam's PipelineOptions classes define -> whether it takes a value."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    beam_parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(beam_parser)  # pylint: disable=protected-access
    return {s: action.nargs != 0 for action in beam_parser._actions for s in action.option_strings}


def check_beam_args(beam_args: Sequence[str], ours: Sequence[str], prog: str = "tpu-shards build") -> None:
    """Refuse an option neither the job nor Beam defines, naming the closest one, and a word that is no option's
    value (a stray `--image-size 224 224`), which Beam would drop without a word."""
    known = beam_option_values()
    takes_value = False
    for arg in beam_args:
        if not arg.startswith("-") or arg in ("-", "--"):
            if not takes_value:
                raise UsageError(f"unrecognized argument {names.shown(arg)}: no option takes it (see {prog} --help)")
            takes_value = False
            continue
        name, eq, _ = arg.partition("=")
        if name not in known:
            raise unknown_option(name, list(ours) + sorted(known), prog)
        takes_value = known[name] and not eq


def parse(argv: Sequence[str], ap: OneLineParser | None = None) -> tuple[argparse.Namespace, list[str]]:
    """(our options, Beam's options), both checked for unknown names; `ap`: a command's parser (the build's)."""
    ap = ap if ap is not None else parser()
    ours = ap.option_names()
    args, beam_args = ap.parse_known_args(normalise(argv, ours))
    check_beam_args(beam_args, ours, ap.prog)
    for option, paths in (("--input", [getattr(args, "input", None)]), ("--output", [getattr(args, "output", None)]),
                          ("--listing", getattr(args, "listing", None) or [])):
        for path in paths:
            check_job_path(path, option)
    return args, list(beam_args)


def check_job_path(path: str | None, option: str) -> None:
    """Refuse a path a job cannot carry (UsageError): a gs:// name with an empty, '.' or '..' part (`gs://b//x`,
    `gs://b/a/../x`), or a local path that is not UTF-8 (the job's steps pass paths as UTF-8 text and the manifest
    records them; file names inside the input may be any bytes, see names.escaped_name)."""
    if path == "":
        raise UsageError(f"{option} is empty; give a local path or a gs:// one")
    problem = names.gcs_name_problem(path) if path and storage.is_gcs(path) else None
    if problem:
        raise UsageError(f"{option} {path} {problem}")
    if path and names.escaped_name(path) != path:
        raise UsageError(f"{option} {names.escaped_name(path)} (shown escaped) is not UTF-8; rename it, or give it "
                         "through a symbolic link with a UTF-8 name")


def _int_list(text: str, what: str, count: tuple[int, ...], low: int, high: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in count or not all(low <= v <= high for v in values):
        raise UsageError(f"{what} {text!r} must be {' or '.join(map(str, count))} integers in {low}..{high}")
    return values


def reject_limit(text: str) -> RejectLimit:
    """--max-rejected: a count of files (e.g. 0, 25) or a percentage of the files seen (e.g. 5%, 0.5%)."""
    value = text.strip()
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return RejectLimit(fraction=percent / 100)
        count = int(value)
        if count < 0:
            raise ValueError
        return RejectLimit(count=count)
    except ValueError:
        raise UsageError(f"--max-rejected {text!r} must be a count (e.g. 0 or 25) or a percentage from 0% to 100% "
                         "(e.g. 5%)") from None


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes this process may still take: the system's available memory, within its cgroup's limit (None when
    neither can be read)."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(f"/sys/fs/cgroup/{limit}", encoding="ascii") as f, \
                    open(f"/sys/fs/cgroup/{usage}", encoding="ascii") as g:
                found.append(int(f.read()) - int(g.read()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return max(0, min(found)) if found else None


def worker_memory(args: argparse.Namespace) -> int:
    """--worker-memory-mb in bytes, checked."""
    least = DEFAULT_WORKER_MEMORY >> 20
    if not least <= args.worker_memory_mb <= 1 << 20:
        raise UsageError(f"--worker-memory-mb {args.worker_memory_mb} must be in {least}..{1 << 20}")
    return args.worker_memory_mb << 20


def build_workers(args: argparse.Namespace, runner: str, direct) -> int:
    """local_workers for a build's or an append's options, on this machine."""
    return local_workers(args.workers, runner, direct.direct_num_workers, direct.direct_running_mode or "",
                         available_cores(), available_memory(), worker_memory(args))


def local_workers(requested: int | None, runner: str, direct_num_workers: int, running_mode: str,
                  cores: int, memory: int | None = None, budget: int = DEFAULT_WORKER_MEMORY) -> int:
    """How many encode processes a build uses: all cores locally, as many as `memory` holds at `budget` bytes
    each; exactly one per SDK process elsewhere. More than that is refused, naming the bound.

    On Dataflow (and any runner that is not Beam's local one) every vCPU already runs its own SDK
    worker process, so a pool would oversubscribe: the encode step runs inline. Locally, Beam's
    multi-processing mode splits the cores among its worker processes.
    """
    if requested is not None and requested < 1:
        raise UsageError("--workers must be at least 1")
    if runner in LOCAL_RUNNERS and running_mode != "multi_processing" and direct_num_workers != 1:
        # Beam runs this process's bundles on several threads; the encode pool is driven by one thread only.
        if requested not in (None, 1):
            raise UsageError(f"--workers {requested} needs Beam's bundles run by one thread of this process: drop "
                             "--direct_num_workers, or add --direct_running_mode=multi_processing")
        return 1
    if runner not in LOCAL_RUNNERS:
        if requested not in (None, 1):
            raise UsageError(f"--workers is for local builds; on {runner or 'this runner'} each vCPU runs its own "
                             "worker process (use the runner's own options, e.g. --max_num_workers)")
        return 1
    share = max(1, direct_num_workers) if running_mode in ("multi_processing", "multi_threading") else 1
    bound, why = max(1, cores // share), f"{cores} cores" + (f" for {share} Beam processes" if share > 1 else "")
    if memory is not None and memory // budget < bound:
        bound, why = max(1, memory // budget), f"{mib(memory)} of memory free, {mib(budget)} per worker"
    if requested is not None and requested > bound:
        raise UsageError(f"--workers {requested} is more than this machine can run: at most {bound} ({why})")
    return requested if requested is not None else bound


def listing_options(args: argparse.Namespace) -> listings.ListingOptions:
    """The listing and label options, checked (without reading any listing); UsageError naming the option."""
    try:
        found = listings.listing_options_from(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not found.listings and not args.input:
        raise UsageError("the following arguments are required: --input (or --listing)")
    if found.split_column and args.splits:
        raise UsageError("--split-column gives each row's split; drop --splits")
    return found


def video_options(args: argparse.Namespace, image: ImageOptions):
    """--video-frames/--video-fps as VideoOptions (None: an image dataset); UsageError naming the option."""
    if args.video_frames is None:
        if args.video_fps is not None:
            raise UsageError("--video-fps needs --video-frames N (the number of frames every record holds)")
        return None
    from shard_utils.media.video import VideoOptions

    try:
        return VideoOptions(frames=args.video_frames, fps=args.video_fps, image=image)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def embed_key(args: argparse.Namespace) -> str:
    """--embed-key as given, else the default feature (left unset so that one given without --embed-model shows)."""
    return schema.EMBEDDING if args.embed_key is None else args.embed_key


def embed_spec(args: argparse.Namespace):
    """--embed-* as an EmbedSpec (None without --embed-model); UsageError naming the option."""
    from shard_utils.media.embed import EmbedError, EmbedSpec, parse_input_size

    named = [o for o in ("embed_preprocess", "embed_input_size", "embed_batch_size", "embed_key", "embed_output")
             if getattr(args, o) is not None]
    if args.embed_model is None:
        if named:
            raise UsageError(f"--{named[0].replace('_', '-')} needs --embed-model")
        return None
    if args.embed_preprocess is None:
        raise UsageError("--embed-model needs --embed-preprocess (scale01, minus1to1, imagenet or none): how the "
                         "model expects its pixels")
    key = embed_key(args)
    if not key or key in schema.FEATURES or key.startswith(schema.EXTRA_PREFIX):
        raise UsageError(f"--embed-key {key!r} must be a new feature name, not one the records already use")
    try:
        size = parse_input_size(args.embed_input_size) if args.embed_input_size else None
        batch = DEFAULT_BATCH_SIZE if args.embed_batch_size is None else args.embed_batch_size
        return EmbedSpec(args.embed_model, args.embed_preprocess, size, batch, args.embed_output)
    except (EmbedError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def check_seed(seed: int | None) -> None:
    """Refuse a --seed the manifest cannot record (an int64), before any work."""
    if seed is not None and abs(seed) > MAX_INT:
        raise UsageError(f"--seed {seed} must be an integer of at most 64 bits (-{MAX_INT}..{MAX_INT})")


def check_format(value: str, shard_extension: str, needed_for: str | None = None) -> str:
    """--format, checked: ArrayRecord needs the array_record package (MissingExtra naming the pip command and
    `needed_for`, what asked for ArrayRecord: default `--format VALUE`), and --shard-extension names TFRecord
    shards, which --format array_record does not publish."""
    if value not in OPTIONS:
        raise UsageError(f"--format {value!r} must be one of {', '.join(OPTIONS)}")
    formats = [get(f) for f in formats_of(value)]
    if TFRECORD not in formats and shard_extension != TFRECORD.extensions[0]:
        raise UsageError(f"--shard-extension {shard_extension} names {TFRECORD.title} shards; --format {value} "
                         "publishes none (use --format both)")
    for shard_format in formats:
        shard_format.check_installed(needed_for or f"--format {value}")
    return value


def tpu_layout(tpu: str | None, num_cores: int | None, num_hosts: int | None) -> tuple[str | None, int, int]:
    """(canonical --tpu name or None, cores per host, hosts) from --tpu, else --num-cores and --num-hosts (8 x 1)."""
    if tpu is not None:
        given = [o for o, v in (("--num-cores", num_cores), ("--num-hosts", num_hosts)) if v is not None]
        if given:
            raise UsageError(f"--tpu sets the cores and hosts; drop {' and '.join(given)} (or --tpu)")
        try:
            slice_ = topology.lookup(tpu)
        except topology.TopologyError as exc:
            raise UsageError(f"--tpu: {exc}") from None
        return slice_.name, slice_.devices_per_host, slice_.hosts
    cores, hosts = 8 if num_cores is None else num_cores, 1 if num_hosts is None else num_hosts
    for name, value in (("--num-cores", cores), ("--num-hosts", hosts)):
        if not 1 <= value <= 65536:
            raise UsageError(f"{name} must be in 1..65536")
    return None, cores, hosts


def check_stratify(splits: list[tuple[str, float]], split_dirs: bool, listing: listings.ListingOptions) -> None:
    """--stratify cuts classes into the --splits fractions: refused where the input gives every split, or where
    there is one split to cut into."""
    if split_dirs or listing.split_column:
        given = "the input's train/validation/test folders" if split_dirs else f"--split-column {listing.split_column}"
        raise UsageError(f"--stratify cuts classes at the --splits fractions; {given} already give every split")
    if len(splits) < 2:
        raise UsageError("--stratify needs --splits with two or more splits, e.g. train=0.9,validation=0.1")


def make_config(args: argparse.Namespace, split_dirs: bool, *, workers: int, temp_root: str,
                run_id: str | None, created: str | None,
                listing: listings.ListingOptions | None = None, local: bool = False) -> BuildConfig:
    """Check the options and turn them into a BuildConfig; raises UsageError with the option named."""
    listing = listing if listing is not None else listing_options(args)
    ids = listing_io.ids_without_template(listing, args.input)
    if ids:
        raise UsageError(ids)
    if args.splits is not None and split_dirs:
        raise UsageError("the input already has train/validation/test folders; drop --splits")
    try:
        splits = inputs.parse_splits(args.splits) if args.splits is not None else [("train", 1.0)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.stratify:
        check_stratify(splits, split_dirs, listing)
    try:
        size = parse_image_size(args.image_size) if args.image_size is not None else None
    except ValueError as exc:
        raise UsageError(f"--image-size {exc}") from None
    if not 1 <= args.jpeg_quality <= 100:
        raise UsageError(f"--jpeg-quality {args.jpeg_quality} must be in 1..100")
    check_seed(args.seed)
    tpu, cores, hosts = tpu_layout(args.tpu, args.num_cores, args.num_hosts)
    unit = cores * hosts
    if args.num_shards is not None and (args.num_shards < 1 or args.num_shards % unit):
        raise UsageError(f"--num-shards {args.num_shards} must be a positive multiple of "
                         f"num_cores x num_hosts = {unit}")
    if not 0 < args.target_shard_mb <= 100_000:
        raise UsageError("--target-shard-mb must be more than 0 and at most 100000")
    if args.max_pixels < 1:
        raise UsageError("--max-pixels must be positive")
    memory = worker_memory(args)
    if args.max_pixels > largest_image(memory):
        raise UsageError(f"--max-pixels {args.max_pixels} is more than any image fits in --worker-memory-mb "
                         f"{memory >> 20} ({largest_image(memory)} pixels); raise --worker-memory-mb")
    if not 0 <= args.label_offset <= 1_000_000:
        raise UsageError("--label-offset must be in 0..1000000")
    if not 0 <= args.hash_bucket_bits <= 20:
        raise UsageError("--hash-bucket-bits must be in 0..20")
    if not 0 < args.run_part_mb <= 4096:
        raise UsageError("--run-part-mb must be more than 0 and at most 4096")
    if not 0 < args.max_file_mb <= 65536:
        raise UsageError("--max-file-mb must be more than 0 and at most 65536")
    if args.near_dups != "report" and (args.quality_checks == "off" or args.validate == "structure"):
        raise UsageError(f"--near-dups {args.near_dups} needs every image's signature, which --quality-checks off and "
                         "--validate structure leave out; give --quality-checks on --validate decode, or --near-dups "
                         "report")
    shard_format = check_format(args.format, args.shard_extension)
    red, green, blue = _int_list(args.background, "--background", (3,), 0, 255)
    image = ImageOptions(size=size, resize=args.resize, quality=args.jpeg_quality, max_pixels=args.max_pixels,
                         background=(red, green, blue), validate=args.validate, memory=memory,
                         inspect=args.quality_checks == "on")
    video = video_options(args, image)
    embed = embed_spec(args)
    return BuildConfig(
        input=args.input, output=args.output, temp_root=temp_root, run_id=run_id, created=created,
        splits=tuple(splits), split_dirs=split_dirs, stratify=args.stratify,
        image=image, video=video, embed=embed, embed_key=embed_key(args),
        num_cores=cores, num_hosts=hosts, tpu=tpu, target_shard_mb=args.target_shard_mb,
        num_shards=args.num_shards, seed=args.seed, tool_version=shard_utils.__version__,
        workers=workers, label_offset=args.label_offset, shard_extension=args.shard_extension, format=shard_format,
        max_rejected=reject_limit(args.max_rejected), bucket_bits=args.hash_bucket_bits,
        run_part_bytes=int(args.run_part_mb * 2**20), max_file_bytes=int(args.max_file_mb * 2**20),
        overwrite=args.overwrite, dedup=args.dedup, near_dups=args.near_dups, follow_symlinks=args.follow_symlinks,
        listing=listing, local=local, described=described(args))
