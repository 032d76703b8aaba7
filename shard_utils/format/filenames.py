"""Every file name of a dataset folder, in one place: shards, indexes, reports, the manifest, TFDS's files, and
the job's own bookkeeping (its lock and its temporary folder). A shard format (`shard_formats`) gives only its
file extensions; the names around them are made here.

Generation g >= 1 of a split (an append) is stored exactly like a split named `<split>-g00g`; the index and the
reports covering generations 0..g get a new name per generation, because the previous manifest names the old
ones, which must stay as they are until the new manifest replaces it.
"""
from __future__ import annotations

import re

from shard_utils.storage.lock import LOCK_NAME  # noqa: F401 - the output's lock, named by the lock

__all__ = [
    "LOCK_NAME", "MANIFEST_NAME", "REJECTED_NAME", "SKIPPED_NAME", "QUALITY_NAME", "TEMP_ROOT", "CROISSANT_NAME",
    "CARD_NAME", "TFDS_DATASET_INFO", "TFDS_FEATURES", "TFDS_LABELS", "TFDS_LABELS_BEFORE", "SHARD_NAME",
    "INDEX_NAME", "INDEX_PATTERN", "GENERATION_TAG", "REPORT_PATTERN", "INDEX_FILE", "REPORT_FILE",
    "generation_split", "shard_name", "shard_pattern", "index_name", "report_name"
]

MANIFEST_NAME = "manifest.json"
REJECTED_NAME = "rejected.jsonl"
SKIPPED_NAME = "skipped.jsonl"
QUALITY_NAME = "quality.jsonl"  # the quality checks' findings (shard_utils.quality.findings)
TEMP_ROOT = ".tpu-shards-tmp"  # runs' temporary folders, when no --temp_location is given
CROISSANT_NAME = "croissant.json"  # the dataset's Croissant description, from the manifest
CARD_NAME = "README.md"  # the dataset card, from the manifest
TFDS_DATASET_INFO = "dataset_info.json"
TFDS_FEATURES = "features.json"
TFDS_LABELS = "image.class.label.labels.txt"  # TFDS names a ClassLabel's file after its key, '/' made '.'
TFDS_LABELS_BEFORE = "image-class-label.labels.txt"  # what earlier versions called it (an overwrite removes it)

SHARD_NAME = "{split}-{index:05d}-of-{count:05d}.{extension}"
INDEX_NAME = "{split}.index.avro"  # beside the shards; never matches the shard-name pattern
INDEX_PATTERN = r"^[A-Za-z0-9_.-]+\.index\.avro$"
GENERATION_TAG = "g{:03d}"
REPORT_PATTERN = r"^(rejected|skipped|quality)\.g\d{3,}\.jsonl$"  # cumulative reports of a generation

INDEX_FILE = re.compile(INDEX_PATTERN)
REPORT_FILE = re.compile(REPORT_PATTERN)


def generation_split(split: str, generation: int) -> str:
    """The name generation `generation` of `split` is stored under (and TFDS reads it as): `train`, `train-g001`."""
    return split if generation == 0 else f"{split}-{GENERATION_TAG.format(generation)}"


def shard_name(split: str, index: int, count: int, extension: str, generation: int = 0) -> str:
    """The file name of shard `index` of `count` of a split (of one generation of it), ending in `extension`."""
    return SHARD_NAME.format(split=generation_split(split, generation), index=index, count=count, extension=extension)


def shard_pattern(extensions: tuple[str, ...]) -> str:
    """The regular expression every shard name ending in one of `extensions` matches (groups split, index,
    count, extension)."""
    ending = "|".join(re.escape(e) for e in extensions)
    return rf"^(?P<split>[A-Za-z0-9_.-]+)-(?P<index>\d{{5}})-of-(?P<count>\d{{5}})\.(?P<extension>{ending})$"


def index_name(split: str, generation: int = 0) -> str:
    """The name of a split's index (covering generations 0..generation), relative to the dataset folder."""
    if generation == 0:
        return INDEX_NAME.format(split=split)
    return f"{split}.{GENERATION_TAG.format(generation)}.index.avro"


def report_name(name: str, generation: int) -> str:
    """`rejected.jsonl` -> `rejected.g001.jsonl`: the report covering generations 0..generation."""
    stem, dot, ext = name.partition(".")
    return name if generation == 0 else f"{stem}.{GENERATION_TAG.format(generation)}{dot}{ext}"
