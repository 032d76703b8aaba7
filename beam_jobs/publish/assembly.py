"""The manifest of a finished build, assembled from its shards' results and its accounting, and the files
derived from a manifest (TFDS's metadata, croissant.json, the card README.md)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from beam_jobs.run.config import DatasetSpec
from beam_jobs.run.identity import RunInfo
from beam_jobs.run.tally import Tally
from shard_utils.errors import InternalError
from shard_utils.format import croissant, schema, shard_formats
from shard_utils.format.filenames import CARD_NAME, CROISSANT_NAME
from shard_utils.format.labels import label_order
from shard_utils.format.manifest import (
    SKIPPED_NAME,
    IndexFile,
    Manifest,
    Shard,
    Split,
    assemble,
)
from shard_utils.quality import findings
from shard_utils.read import card, tfds_meta
from shard_utils.sharding.writer import ShardResult

__all__ = ["build_manifest", "quality_section", "twin_entry", "in_place_order", "with_indexes", "named_files",
           "tfds_files", "described_files"]


def build_manifest(config: DatasetSpec, run: RunInfo, results: Sequence[ShardResult], plans: Mapping,
                   rejected: Mapping[str, int], tally: Tally, labels: Sequence[str], has_skipped_files: bool,
                   known_labels: Sequence[str] = ()) -> Manifest:
    """The manifest of a finished build, without its splits' index entries (see `commit`); InternalError if a
    shard is missing or the accounting does not close. Label ids are the names in label order (numeric when every
    label is an integer; `labels.label_order`), after `known_labels`, which keep theirs. `plans`: each split's plan
    (anything with `num_shards`); `rejected`: the rejects by reason."""
    names = label_order(labels, known_labels)
    first = shard_formats.get(config.formats[0])  # what `shards` are: TFRecord when published
    splits = {}
    longest: Counter = Counter()
    for r in results:
        for key, n in r.max_lengths:
            longest[key] = max(longest[key], n)
    for split, split_plan in sorted(plans.items()):
        mine = in_place_order(results, split)
        if sorted(r.index for r in mine) != list(range(split_plan.num_shards)):
            raise InternalError(f"split {split!r}: expected {split_plan.num_shards} shards, got {len(mine)}")
        classes: Counter = Counter()
        for r in mine:
            classes.update(dict(r.class_counts))
        tfrecords = [Shard(r.name, r.num_records, r.num_bytes, r.crc32c, r.sha256) for r in mine]
        twins = [twin_entry(r) for r in mine] if shard_formats.ARRAY_RECORD.name in config.formats else None
        shards = tfrecords if shard_formats.TFRECORD.name in config.formats else twins or []
        num_records = sum(r.num_records for r in mine)
        splits[split] = Split(
            num_records=num_records, num_bytes=sum(s.num_bytes for s in shards),
            class_counts={name: classes.get(i, 0) for i, name in enumerate(names)},
            shards=shards, array_record_shards=twins if shards is tfrecords else None,
            unlabeled=0 if names else num_records)  # a build is labeled or not as a whole (encode.unlabeled_reject)
    image = config.image
    multi_label = config.listing.multi_label or longest[schema.LABEL] > 1
    video = config.video
    embedding: dict[str, Any] | None = None
    if config.embed is not None:
        info: dict[str, Any] = dict(config.embed_info)
        dim = int(info["embedding_dim"])
        shape = [video.frames, dim] if video else [dim]
        embedding = {"key": config.embed_key, "shape": shape, **info}
    features = schema.feature_table(
        media="video" if video else "image", num_frames=video.frames if video else None, multi_label=multi_label,
        extras=config.listing.extras, max_lengths=longest, embedding_key=embedding["key"] if embedding else None,
        embedding_shape=embedding["shape"] if embedding else None)
    return assemble(
        splits=splits, rejected=rejected, skipped=dict(tally.skipped), skipped_extensions=dict(tally.extensions),
        seen=tally.seen, skipped_path=SKIPPED_NAME if has_skipped_files else None,
        tool_version=config.tool_version, created=run.created, input=config.input or "",
        options=config.manifest_options(), features=features, labels=names, multi_label=multi_label,
        media="video" if video else "image", embedding=embedding,
        image_size=list(image.size) if image.size and image.resize != "fit" else None,
        num_cores=config.num_cores, num_hosts=config.num_hosts, label_offset=config.label_offset,
        shard_format=first.name, format_version=first.manifest_version)


def quality_section(by_kind: Mapping[str, int], path: str) -> dict:
    """The manifest's quality section: the findings' count, their count per kind (every kind named), the report."""
    counts = {kind: int(by_kind.get(kind, 0)) for kind in findings.KINDS}
    return {"count": sum(counts.values()), "by_kind": counts, "path": path}


def twin_entry(r: ShardResult) -> Shard:
    """The manifest entry of a shard's ArrayRecord twin."""
    if r.array_record is None:
        raise InternalError(f"shard {r.name} has no ArrayRecord twin")
    t = r.array_record
    return Shard(t.name, t.num_records, t.num_bytes, t.crc32c, t.sha256)


def in_place_order(results: Sequence[ShardResult], split: str) -> list[ShardResult]:
    return sorted((r for r in results if r.split == split), key=lambda r: r.place)


def with_indexes(m: Manifest, indexes: Mapping[str, IndexFile]) -> Manifest:
    """The manifest with the index entries of the splits that got a new one."""
    missing = [name for name, s in m.splits.items() if s.index is None and name not in indexes
               and m.first_format.indexed]
    if missing:
        raise InternalError(f"split {missing[0]!r} has no index")
    splits = {name: replace(s, index=indexes.get(name, s.index)) for name, s in m.splits.items()}
    return replace(m, splits=splits)


def named_files(m: Manifest) -> set[str]:
    """Every file a manifest names: shards, indexes, reports."""
    names = {s.path for split in m.splits.values() for s in split.shards}
    names |= {s.path for split in m.splits.values() for s in split.array_record_shards or ()}
    names |= {split.index.path for split in m.splits.values() if split.index is not None}
    names |= {part["path"] for part in (m.rejected, m.skipped, m.quality or {}) if part.get("path")}
    return names


def tfds_files(manifest: Manifest) -> dict[str, bytes]:
    """TFDS's metadata files, so `tfds.builder_from_directory` reads the dataset; none where TFDS cannot
    describe it (video, or split names TFDS refuses)."""
    try:
        return tfds_meta.tfds_files(manifest)
    except ValueError:
        return {}


def described_files(manifest: Manifest, output: str) -> dict[str, bytes]:
    """Every file derived from the manifest beside it in `output`: TFDS's metadata, croissant.json and the card
    README.md (both named after the output folder unless --name was given)."""
    placed = replace(manifest, location=output)
    return {**tfds_files(manifest), CROISSANT_NAME: croissant.croissant_bytes(placed),
            CARD_NAME: card.card_bytes(placed)}
