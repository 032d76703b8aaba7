"""Test helpers that read what the job wrote, independently of the loader."""
from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

from shard_utils.format import schema
from shard_utils.format.tfrecord import iter_records


def records(path: Path) -> list[dict]:
    """Every record of one shard, parsed."""
    with open(path, "rb") as f:
        return [schema.decode_example(r) for r in iter_records(f)]


def all_records(out: Path, split: str = "train") -> list[dict]:
    m = json.loads((out / "manifest.json").read_text())
    return [r for s in m["splits"][split]["shards"] for r in records(out / s["path"])]


def by_source(out: Path, split: str = "train") -> dict[str, dict]:
    return {r[schema.SOURCE_ID].decode(): r for r in all_records(out, split)}


def decoded(record: dict) -> Image.Image:
    image = Image.open(io.BytesIO(record[schema.IMAGE_ENCODED]))
    assert image.format == "JPEG"
    image.load()
    return image


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord"))}


def rejected(out: Path) -> dict[str, str]:
    lines = (out / "rejected.jsonl").read_text().splitlines()
    return {json.loads(line)["source"]: json.loads(line)["reason"] for line in lines}


TFDS_FILES = ["dataset_info.json", "features.json", "image.class.label.labels.txt"]


def dataset_files(splits=("train",), rejected=True, skipped=False, quality=True) -> list[str]:
    """The files a published image dataset holds besides its shards. `quality`: the build ran the quality checks
    (the default), which publishes quality.jsonl whether or not it found anything, as rejected.jsonl."""
    names = ["manifest.json", "croissant.json", "README.md", *TFDS_FILES, *(f"{s}.index.avro" for s in splits)]
    return (names + (["rejected.jsonl"] if rejected else []) + (["skipped.jsonl"] if skipped else [])
            + (["quality.jsonl"] if quality else []))
