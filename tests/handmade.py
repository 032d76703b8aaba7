"""Datasets written by hand, record by record, with a valid manifest: for what the build never produces
(hostile label texts and source ids, video records) but a downloaded dataset may hold."""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from shard_utils import storage
from shard_utils.format import schema, tfrecord
from shard_utils.format.manifest import Manifest, Shard, Split


def jpeg(seed: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A small JPEG whose colour depends on seed."""
    color = ((seed * 67) % 256, (seed * 131 + 80) % 256, (seed * 29 + 160) % 256)
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def image_record(i: int, label: int, label_text: str, source_id: str, data: bytes | None = None) -> schema.ImageRecord:
    data = jpeg(i) if data is None else data
    return schema.ImageRecord(encoded=data, height=30, width=40, channels=3, label=label, label_text=label_text,
                              source_id=source_id, sha256=hashlib.sha256(data).hexdigest())


def video_record(i: int, label: int, label_text: str, source_id: str, frames: int = 3) -> schema.ImageRecord:
    clip = tuple(jpeg(i * 10 + k) for k in range(frames))
    return schema.ImageRecord(encoded=b"", height=30, width=40, channels=3, label=label, label_text=label_text,
                              source_id=source_id, sha256=hashlib.sha256(b"".join(clip)).hexdigest(),
                              frames=clip, frame_rate=2.0)


def write_dataset(folder: Path, splits: dict[str, Sequence[schema.ImageRecord]], labels: Sequence[str], *,
                  shard_prefix: dict[str, str] | None = None, shards_per_split: int = 2, media: str = "image",
                  rejected: Sequence[str] = (), rejected_by_reason: dict[str, int] | None = None,
                  options: dict | None = None, input_text: str = "handmade") -> Manifest:
    """Frame each split's records into shards, write rejected.jsonl lines as given, and a manifest whose
    checksums and accounting are right; returns the loaded-equivalent Manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    out_splits = {}
    for name, records in splits.items():
        prefix = (shard_prefix or {}).get(name, name)
        count = min(shards_per_split, len(records))
        shards = []
        for s in range(count):
            chunk = records[s::count]
            shard_name = f"{prefix}-{s:05d}-of-{count:05d}.tfrecord"
            data = b"".join(tfrecord.frame(schema.encode_example(r)) for r in chunk)
            (folder / shard_name).write_bytes(data)
            digest = storage.Digest()
            digest.update(data)
            shards.append(Shard(shard_name, len(chunk), digest.size, digest.crc32c, digest.sha256))
        class_counts: dict[str, int] = {}
        for r in records:
            class_counts[r.label_names[0]] = class_counts.get(r.label_names[0], 0) + 1
        out_splits[name] = Split(len(records), sum(s.num_bytes for s in shards), class_counts, shards)
    (folder / "rejected.jsonl").write_text("".join(line + "\n" for line in rejected), encoding="utf-8")
    num_rejected = len(rejected)
    features = schema.feature_table(media=media, num_frames=3 if media == "video" else None)
    m = Manifest(tool_version="0.1.0", created="2026-01-01T00:00:00+00:00", input=input_text,
                 options=options if options is not None else {"target_shard_mb": 128.0, "seed": 0},
                 features=features, labels=list(labels), splits=out_splits,
                 rejected={"count": num_rejected, "by_reason": rejected_by_reason or {}, "path": "rejected.jsonl"},
                 skipped={"count": 0, "by_reason": {}},
                 files_seen=sum(len(r) for r in splits.values()) + num_rejected, num_cores=1, num_hosts=1,
                 media=media, location=str(folder))
    (folder / "manifest.json").write_text(m.to_json(), encoding="utf-8")
    return m


def rejected_line(source: str, reason: str, message: str) -> str:
    return json.dumps({"source": source, "reason": reason, "message": message}, ensure_ascii=False)
