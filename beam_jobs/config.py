"""The settings of one build, as the pipeline's steps see them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shard_utils.images import ImageOptions


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build needs besides Beam's own options; plain values so it pickles to workers."""

    input: str
    output: str
    temp_dir: str
    splits: list[tuple[str, float]] = field(default_factory=lambda: [("train", 1.0)])
    split_dirs: bool = False
    image: ImageOptions = ImageOptions()
    num_cores: int = 8
    num_hosts: int = 1
    target_shard_mb: float = 128.0
    num_shards: int | None = None
    seed: int = 0
    tool_version: str = ""
    created: str = ""

    def manifest_options(self) -> dict[str, Any]:
        """The options that shape the dataset, as recorded in the manifest."""
        return {
            "splits": "from folders" if self.split_dirs else dict(self.splits),
            "image_size": list(self.image.size) if self.image.size else None,
            "resize": self.image.resize,
            "jpeg_quality": self.image.quality,
            "max_pixels": self.image.max_pixels,
            "background": list(self.image.background),
            "validate": self.image.validate,
            "num_cores": self.num_cores,
            "num_hosts": self.num_hosts,
            "target_shard_mb": self.target_shard_mb,
            "num_shards": self.num_shards,
            "seed": self.seed,
        }
