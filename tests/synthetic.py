"""Write small datasets the job cannot build yet (multi-label, extras, video, embeddings, label offsets).

Records are encoded with the real `schema.encode_example`, framed with `tfrecord.frame`, and described
by a real `manifest.Manifest` whose shard sizes, CRC32C and SHA-256 come from `storage.Digest`, so the
loader (and `verify`) read them exactly as they would read the job's output.
"""
from __future__ import annotations

import hashlib
import io
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from shard_utils import storage
from shard_utils.format import manifest as manifest_lib
from shard_utils.format import schema
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.format.tfrecord import frame


def jpeg(seed: int, size: tuple[int, int] = (16, 12), quality: int = 95) -> bytes:
    """A small JPEG (width, height) of smooth colour, distinct per seed."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 9 + seed * 37) % 256, (y * 11 + seed * 53) % 256,
                       np.full_like(x, (seed * 71) % 256)], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=quality)
    return out.getvalue()


def record(i: int, label_ids: Sequence[int], labels: Sequence[str], *, offset: int = 0, multi_label: bool = False,
           size: tuple[int, int] = (16, 12), frames: int | Sequence[bytes] | None = None, encoded: bytes | None = None,
           extras: Sequence[tuple[schema.ExtraSpec, tuple]] = (), embedding: Sequence[float] | None = None,
           embedding_key: str = schema.EMBEDDING) -> schema.ImageRecord:
    """Record `i` with the given 0-based label ids, stored as id + offset (as the job stores them).

    `frames` makes a video record: a count of distinct frames, or the frames' JPEG bytes.
    """
    stored = tuple(int(k) + offset for k in label_ids)
    if isinstance(frames, int):
        frames = tuple(jpeg(i * 100 + f, size) for f in range(frames))
    if encoded is None:
        encoded = jpeg(i, size) if frames is None else b""
    return schema.ImageRecord(
        encoded=encoded, height=size[1], width=size[0], channels=3,
        label=stored[0] if stored else 0, label_text=labels[label_ids[0]] if label_ids else "",
        source_id=f"item{i:04d}", sha256=hashlib.sha256(f"item{i}".encode()).hexdigest(),
        labels=stored if multi_label else None,
        label_texts=tuple(labels[k] for k in label_ids) if multi_label else None,
        frames=tuple(frames) if frames else None,
        frame_rate=10.0 if frames else None, extras=tuple(extras),
        embedding=tuple(embedding) if embedding is not None else None, embedding_key=embedding_key)


def write_dataset(out: Path, splits: dict[str, list[schema.ImageRecord]], labels: Sequence[str],
                  features: dict, *, num_shards: int = 2, label_offset: int = 0, multi_label: bool = False,
                  media: str = "image", image_size: Sequence[int] | None = None,
                  embedding: dict | None = None) -> manifest_lib.Manifest:
    """Shard each split's records round-robin into `num_shards` files and write a manifest beside them."""
    out.mkdir(parents=True, exist_ok=True)
    split_objs = {}
    for split, items in splits.items():
        shards = []
        for index in range(num_shards):
            mine = items[index::num_shards]
            name = TFRECORD.shard_name(split, index, num_shards)
            data = b"".join(frame(schema.encode_example(r)) for r in mine)
            (out / name).write_bytes(data)
            digest = storage.Digest()
            digest.update(data)
            shards.append(manifest_lib.Shard(name, len(mine), digest.size, digest.crc32c, digest.sha256))
        counts = Counter(text for r in items for text in r.label_names)
        split_objs[split] = manifest_lib.Split(len(items), sum(s.num_bytes for s in shards), dict(counts), shards)
    total = sum(len(v) for v in splits.values())
    m = manifest_lib.Manifest(
        tool_version="test", created="2026-01-01T00:00:00Z", input="synthetic", options={}, features=features,
        labels=list(labels), splits=split_objs, rejected={"count": 0}, skipped={"count": 0}, files_seen=total,
        image_size=list(image_size) if image_size else None, media=media, label_offset=label_offset,
        multi_label=multi_label, embedding=embedding)
    (out / manifest_lib.MANIFEST_NAME).write_text(m.to_json())
    return manifest_lib.load(str(out))  # validated as the loader will read it
