"""The settings of one job, as its steps see them: what shapes the dataset (`DatasetSpec`, recorded in the
manifest) and how this run executes (`RunSettings`); `BuildConfig` is both."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shard_utils import storage
from shard_utils.format import shard_formats
from shard_utils.inputs.listings import ListingOptions
from shard_utils.media.embed import EmbedSpec
from shard_utils.media.encode import EncodeSettings
from shard_utils.media.images import ImageOptions
from shard_utils.media.reads import DEFAULT_MAX_FILE_BYTES
from shard_utils.media.video import VideoOptions
from shard_utils.sharding.plan import DEFAULT_BUCKET_BITS
from shard_utils.sharding.runs import CHUNK_BYTES
from shard_utils.storage.lock import LEASE_SECONDS

__all__ = ["RejectLimit", "RunSettings", "DatasetSpec", "BuildConfig"]


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


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How this run executes: where it writes, under which id, with how many workers and parts of what size.
    None of it changes the dataset's bytes, and none of it is recorded in the manifest."""

    output: str
    temp_root: str  # runs' temporary folders live under it: <output>/.tpu-shards-tmp or <temp_location>/...
    run_id: str | None = None  # None: decided when the job runs (a template launch)
    created: str | None = None
    lease_seconds: float = LEASE_SECONDS  # how long the output's lock holds a run without a renewal
    overwrite: bool = False  # --overwrite: replace a dataset already in the output
    workers: int = 1
    bucket_bits: int = DEFAULT_BUCKET_BITS  # a split's keys are counted in 2**bucket_bits ranges to find its cuts
    fragment_bytes: int = 64 * 2**20  # an encoder writes its buffered records as one sorted fragment at this size
    run_part_bytes: int = CHUNK_BYTES  # on gs://, runs are written as parts of about this size
    # A local run (Beam's in-process runner) reports a build that cannot publish through a Beam metric
    # the driver reads (an exception in a local worker process prints Beam's traceback), where a remote
    # run fails the job with the message; and it streams the listing into the encode step, where a
    # remote run reshuffles it to spread the work over Dataflow's workers.
    local: bool = False

    def temp_dir(self, run_id: str) -> str:
        return storage.join(self.temp_root, run_id)


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """What shapes the dataset: the input, how it is split, encoded, checked and cut into shards (the options
    `manifest_options` records in the manifest)."""

    input: str | None  # None: a listing of absolute paths only
    # () where no fractions cut the splits and no folder or column names them: a reshard keeps the source's.
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
    label_offset: int = 0
    shard_extension: str = shard_formats.TFRECORD.extensions[0]
    format: str = shard_formats.TFRECORD.name  # --format: which shards are published (tfrecord, array_record or both)
    max_rejected: RejectLimit = RejectLimit(fraction=0.5)
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # larger source files are rejected `too_large`, never read whole
    dedup: bool = False
    near_dups: str = "report"  # --near-dups: report, group or drop (beam_jobs.pipeline.near_dups)
    follow_symlinks: bool = False
    listing: ListingOptions = ListingOptions()
    described: tuple[tuple[str, str], ...] = ()  # --name, --license, ...: the manifest's options["metadata"]
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

    def encode_settings(self, label_ids: dict[str, int]) -> EncodeSettings:
        """How the build encodes an item, with these label ids."""
        return EncodeSettings(image=self.image, seed=self.seed, splits=self.splits, label_ids=label_ids,
                              label_offset=self.label_offset, extras=self.listing.extras, video=self.video,
                              frame_now=self.embed is None, max_file_bytes=self.max_file_bytes)

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


@dataclass(frozen=True, kw_only=True)
class BuildConfig(DatasetSpec, RunSettings):
    """Everything a job needs besides Beam's own options: what shapes the dataset and how this run executes;
    plain values, so it pickles to workers. A step that needs only one half takes that type."""

