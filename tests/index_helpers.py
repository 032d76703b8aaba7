"""TEST-ONLY ways to give a dataset an index, until the job's shard writer writes it itself.

`add_index` scans the shards of a dataset the job built and writes each split's index with the same
`row_from_record` / `write_index` calls the writer will make. The real job never re-reads shards to
build an index. `write_dataset` writes a small dataset (shards, index, manifest) straight from
ImageRecords, the way the writer does, for shapes the job cannot build yet (multi-label, extras).
"""
from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from conftest import photo

from shard_utils import storage
from shard_utils.format import index, schema
from shard_utils.format import manifest as manifest_mod
from shard_utils.format.manifest import IndexFile, Manifest, Shard, Split
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.format.tfrecord import frame, iter_records
from shard_utils.media.encode import RecordMeta


def framed_records(path: Path) -> list[tuple[int, int, bytes]]:
    """(offset, framed length, record) of every record of a shard file, by scanning it (test-only)."""
    out = []
    with open(path, "rb") as f:
        offset = 0
        for data in iter_records(f):
            end = f.tell()
            out.append((offset, end - offset, data))
            offset = end
    return out


def _extra_specs(m: Manifest) -> list[schema.ExtraSpec]:
    return [schema.ExtraSpec(k[len(schema.EXTRA_PREFIX):], v["dtype"], v["shape"] == [schema.VARIABLE])
            for k, v in m.features.items() if k.startswith(schema.EXTRA_PREFIX)]


def record_of(data: bytes, m: Manifest) -> schema.ImageRecord:
    """The ImageRecord a serialized record was encoded from (checked: it re-encodes to the same bytes)."""
    f = schema.decode_lists(data)
    extras = tuple((spec, tuple(v.decode() if isinstance(v, bytes) else v for v in f.get(spec.key, [])))
                   for spec in _extra_specs(m))
    labels, texts = tuple(f[schema.LABEL]), tuple(t.decode() for t in f[schema.LABEL_TEXT])
    record = schema.ImageRecord(
        encoded=f[schema.IMAGE_ENCODED][0], height=f[schema.IMAGE_HEIGHT][0], width=f[schema.IMAGE_WIDTH][0],
        channels=f[schema.IMAGE_CHANNELS][0], label=labels[0] if labels else 0,
        label_text=texts[0] if texts else "", source_id=f[schema.SOURCE_ID][0].decode(),
        sha256=f[schema.SHA256][0].decode(), image_format=f[schema.IMAGE_FORMAT][0].decode(),
        labels=labels if m.multi_label else None, label_texts=texts if m.multi_label else None, extras=extras)
    assert schema.encode_example(record) == data, "test helper could not rebuild the record"
    return record


def redescribed(out: Path) -> Manifest:
    """The rewritten manifest, with croissant.json made again from it (as `inspect --write-croissant` would), so it
    lists the new index."""
    from shard_utils.format import croissant

    m = manifest_mod.load(str(out))
    if (out / "croissant.json").exists():
        (out / "croissant.json").write_bytes(croissant.croissant_bytes(m))
    return m


def add_index(out: Path) -> Manifest:
    """Write <split>.index.avro for every split of a job-built dataset and record them in its manifest."""
    m = manifest_mod.load(str(out))
    raw = json.loads((out / "manifest.json").read_text())
    schema_ = index.index_schema(_extra_specs(m))
    for name, split in m.splits.items():
        rows = (index.row_from_record(i, offset, length, record_of(data, m), m.label_offset)
                for i, shard in enumerate(split.shards)
                for offset, length, data in framed_records(out / shard.path))
        path = index.index_name(name)
        with open(out / path, "wb") as f:
            written = index.write_index(f, rows, schema_)
        raw["splits"][name]["index"] = written.index_file(path).__dict__
    (out / "manifest.json").write_text(json.dumps(raw, indent=2))
    return redescribed(out)


def image_record(i: int, label_ids: Sequence[int], labels: Sequence[str], *, multi_label: bool = False,
                 label_offset: int = 0, extras=(), size=(24, 16)) -> schema.ImageRecord:
    """A small real JPEG record; label ids are 0-based (stored with label_offset added)."""
    buf = io.BytesIO()
    photo(*size, seed=i).save(buf, "JPEG", quality=90)
    stored = tuple(label + label_offset for label in label_ids)
    names = tuple(labels[label] for label in label_ids)
    return schema.ImageRecord(
        encoded=buf.getvalue(), height=size[1], width=size[0], channels=3,
        label=stored[0] if stored else 0, label_text=names[0] if names else "", source_id=f"img/{i:05d}.jpg",
        sha256=hashlib.sha256(f"source {i}".encode()).hexdigest(),
        labels=stored if multi_label else None, label_texts=names if multi_label else None, extras=tuple(extras))


def write_dataset(out: Path, shards: dict[str, list[list[schema.ImageRecord]]], labels: list[str], *,
                  multi_label: bool = False, label_offset: int = 0,
                  extras: Sequence[schema.ExtraSpec] = ()) -> Manifest:
    """Shards, indexes and a manifest from records, written as the job's writer does (test-only): each shard's
    writer makes its rows with `row_from_meta` into a part, and the split's index is a header and the parts' blocks."""
    out.mkdir(parents=True, exist_ok=True)
    schema_ = index.index_schema(extras)
    splits = {}
    for name, shard_records in shards.items():
        entries, parts, classes = [], [], Counter()
        for i, records in enumerate(shard_records):
            path = TFRECORD.shard_name(name, i, len(shard_records))
            digest, rows = storage.Digest(), []
            with open(out / path, "wb") as f:
                for record in records:
                    framed = frame(schema.encode_example(record))
                    meta = RecordMeta(0, record.source_id, len(framed),
                                      tuple(label - label_offset for label in record.label_ids), record.sha256,
                                      record.height, record.width, tuple((s.name, v) for s, v in record.extras))
                    rows.append(index.row_from_meta(i, digest.size, meta, extras, multi_label=multi_label))
                    f.write(framed)
                    digest.update(framed)
                    classes.update(record.label_names)
            entries.append(Shard(path, len(records), digest.size, digest.crc32c, digest.sha256))
            parts.append(index.index_blocks(rows, schema_))
        path = index.index_name(name)
        data = index.index_header(schema_) + b"".join(parts)
        (out / path).write_bytes(data)
        digest = storage.Digest()
        digest.update(data)
        index_file = IndexFile(path, sum(len(rs) for rs in shard_records), digest.size, digest.crc32c, digest.sha256)
        splits[name] = Split(sum(s.num_records for s in entries), sum(s.num_bytes for s in entries),
                             {label: classes.get(label, 0) for label in labels}, entries, index_file)
    lengths = {}
    if multi_label:
        longest = max(len(r.label_ids) for recs in shards.values() for rs in recs for r in rs)
        lengths = {schema.LABEL: longest, schema.LABEL_TEXT: longest}
    for spec in extras:
        if spec.is_list:
            lengths[spec.key] = max(len(v) for recs in shards.values() for rs in recs for r in rs
                                    for s, v in r.extras if s == spec)
    features = schema.feature_table(multi_label=multi_label, extras=extras, max_lengths=lengths)
    total = sum(s.num_records for s in splits.values())
    m = Manifest(tool_version="test", created="", input="test", options={}, features=features, labels=list(labels),
                 splits=splits, rejected={"count": 0}, skipped={"count": 0}, files_seen=total,
                 label_offset=label_offset, multi_label=multi_label)
    (out / manifest_mod.MANIFEST_NAME).write_text(m.to_json())
    return manifest_mod.load(str(out))



def rewrite_index(out: Path, split: str, change) -> None:
    """Replace a split's index rows by change(rows) and record the new file in the manifest (tampering, test-only)."""
    m = manifest_mod.load(str(out))
    entry = m.split(split).index
    with open(out / entry.path, "rb") as f:
        rows = list(index.read_index(f))
    with open(out / entry.path, "wb") as f:
        written = index.write_index(f, iter(change(rows)), index.index_schema(_extra_specs(m)))
    raw = json.loads((out / "manifest.json").read_text())
    raw["splits"][split]["index"] = {**written.index_file(entry.path).__dict__, "num_rows": entry.num_rows}
    (out / "manifest.json").write_text(json.dumps(raw, indent=2))
    redescribed(out)
