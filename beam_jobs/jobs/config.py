"""The settings of one build, as the pipeline's steps see them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shard_utils import storage
from shard_utils.format import shard_formats
from shard_utils.inputs.listings import ListingOptions
from shard_utils.media.embed import EmbedSpec
from shard_utils.media.images import ImageOptions
from shard_utils.media.reads import DEFAULT_MAX_FILE_BYTES
from shard_utils.media.video import VideoOptions
from shard_utils.sharding.plan import DEFAULT_BUCKET_BITS
from shard_utils.sharding.runs import CHUNK_BYTES
from shard_utils.storage.lock import LEASE_SECONDS


@dataclass(frozen=True)
class RejectLimit:
    """--max-rejected: at most `count` files, or at most `fraction` of the files seen."""

    count: int | None = None
    fraction: float | None = None

    def exceeded(self, rejected: int, seen: int) -> bool:
        if self.count is not None:
            return rejected > self.count
        return rejected > (self.fraction or 0.0) * seen

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{(self.fraction or 0) * 100:g}%"


@dataclass(frozen=True)
class RunInfo:
    """What is decided once per run: its id, its temporary folder and when it was created.

    A driver decides it before submitting; a Dataflow template decides it at launch, inside the job,
    so that every launch of one template gets its own.
    """

    run_id: str
    temp_dir: str
    created: str


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build needs besides Beam's own options; plain values so it pickles to workers."""

    input: str | None  # None: a listing of absolute paths only
    output: str
    temp_root: str  # runs' temporary folders live under it: <output>/.tpu-shards-tmp or <temp_location>/...
    run_id: str | None = None  # None: decided when the job runs (a template launch)
    created: str | None = None
    lease_seconds: float = LEASE_SECONDS  # how long the output's lock holds a run without a renewal
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    split_dirs: bool = False
    stratify: bool = False  # --stratify: each class cut into the splits at their fractions (pipeline.stratify)
    image: ImageOptions = ImageOptions()
    num_cores: int = 8
    num_hosts: int = 1
    tpu: str | None = None  # --tpu: the accelerator type num_cores and num_hosts came from
    target_shard_mb: float = 128.0
    num_shards: int | None = None
    seed: int = 0
    tool_version: str = ""
    workers: int = 1
    label_offset: int = 0
    shard_extension: str = shard_formats.TFRECORD.extensions[0]
    format: str = shard_formats.TFRECORD.name  # --format: which shards are published (tfrecord, array_record or both)
    max_rejected: RejectLimit = RejectLimit(fraction=0.5)
    bucket_bits: int = DEFAULT_BUCKET_BITS
    fragment_bytes: int = 64 * 2**20  # an encoder writes its buffered records as one sorted fragment at this size
    run_part_bytes: int = CHUNK_BYTES  # on gs://, runs are written as parts of about this size
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # larger source files are rejected `too_large`, never read whole
    overwrite: bool = False
    dedup: bool = False
    near_dups: str = "report"  # --near-dups: report, group or drop (beam_jobs.pipeline.near_dups)
    follow_symlinks: bool = False
    listing: ListingOptions = ListingOptions()
    described: tuple[tuple[str, str], ...] = ()  # --name, --license, ...: the manifest's options["metadata"]
    # A local run (Beam's in-process runner) reports a build that cannot publish through a Beam metric
    # the driver reads (an exception in a local worker process prints Beam's traceback), where a remote
    # run fails the job with the message; and it streams the listing into the encode step, where a
    # remote run reshuffles it to spread the work over Dataflow's workers.
    local: bool = False
    video: VideoOptions | None = None  # a video dataset: clips sampled into frames
    embed: EmbedSpec | None = None  # a model run on every image (or frame): its embedding goes in the record
    embed_key: str = "image/embedding"
    embed_info: tuple[tuple[str, object], ...] = ()  # the model's identity (embed.ModelInfo), for the manifest

    @property
    def splits_from_data(self) -> bool:
        """Whether every item's split comes from the input (split folders or a split column), not --splits."""
        return self.split_dirs or self.listing.split_column is not None

    @property
    def quality_checks(self) -> bool:
        """Whether the build inspects its images (signatures and flags) and publishes quality.jsonl: images only."""
        return self.image.inspect and self.video is None

    @property
    def formats(self) -> tuple[str, ...]:
        """The shard formats published: ("tfrecord",), ("array_record",) or both, TFRecord first."""
        return shard_formats.formats_of(self.format)

    @property
    def array_record(self) -> bool:
        """Whether ArrayRecord twins of the shards are written."""
        return shard_formats.ARRAY_RECORD.name in self.formats

    @property
    def uses_listing(self) -> bool:
        return bool(self.listing.listings)

    def temp_dir(self, run_id: str) -> str:
        return storage.join(self.temp_root, run_id)

    def listing_shape(self) -> dict[str, Any]:
        """The listing options that decide each row's file, labels and split (None without a listing)."""
        used = bool(self.listing.listings)
        return {name: getattr(self.listing, name) if used else None
                for name in ("path_column", "path_template", "label_column", "label_separator", "split_column",
                             "extra_separator")}

    def manifest_options(self) -> dict[str, Any]:
        """The options that shape the dataset, as recorded in the manifest."""
        return {
            "splits": ("from folders" if self.split_dirs else f"from column {self.listing.split_column}"
                       if self.listing.split_column else dict(self.splits)),
            "stratify": self.stratify,
            "image_size": list(self.image.size) if self.image.size else None,
            "resize": self.image.resize,
            "jpeg_quality": self.image.quality,
            "max_pixels": self.image.max_pixels,
            "background": list(self.image.background),
            "validate": self.image.validate,
            "quality_checks": "on" if self.image.inspect else "off",
            "num_cores": self.num_cores,
            "num_hosts": self.num_hosts,
            "tpu": self.tpu,
            "target_shard_mb": self.target_shard_mb,
            "num_shards": self.num_shards,
            "seed": self.seed,
            "label_offset": self.label_offset,
            "shard_extension": self.shard_extension,
            "format": self.format,
            "max_rejected": str(self.max_rejected),
            "dedup": self.dedup,
            "near_dups": self.near_dups,
            "follow_symlinks": self.follow_symlinks,
            "listings": list(self.listing.listings),
            "extra_columns": [f"{e.name}:{e.dtype}{'[]' if e.is_list else ''}" for e in self.listing.extras],
            "label_from_name": self.listing.label_from_name,
            **self.listing_shape(),
            "video_frames": self.video.frames if self.video else None,
            "video_fps": self.video.fps if self.video else None,
            "embed_model": self.embed.model if self.embed else None,
            **({"metadata": dict(self.described)} if self.described else {}),
        }
