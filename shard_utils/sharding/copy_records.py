"""A published shard's records, copied byte for byte with the metadata a shard writer needs (for reshard).

No image is decoded: each framed record is read, its two CRCs checked and its bytes kept as they are; its
metadata (`encode.RecordMeta`: source id, labels, SHA-256, size, extras) comes from the split's index row, once
the row's source id and labels are found to be the record's own, or, for a dataset without an index, from the
record's own fields. The sort key comes from the new seed.
Every shard is checked against its manifest entry (record count, size, CRC32C, SHA-256) and against its
index rows (each row's place); the first mismatch is a DamagedShard naming the shard. A shard no index describes
(an ArrayRecord shard: a dataset built with --format array_record) is read through its format and gives its
records framed as TFRecord records, their metadata from their own fields.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.format import array_record, schema
from shard_utils.format.generations import DigestingReader
from shard_utils.format.index import IndexRow, field_name, identity_problem
from shard_utils.format.manifest import Shard
from shard_utils.format.order import sort_key
from shard_utils.format.shard_formats import ShardFormat
from shard_utils.format.tfrecord import FramingError, frame, iter_records
from shard_utils.media.encode import RecordMeta

__all__ = ["DamagedShard", "shard_records", "unindexed_shard_records", "meta_from_row", "meta_from_record"]


class DamagedShard(ValueError, TpuShardsError):
    """A source shard does not match its manifest or index; the message names the shard and what is wrong."""


def shard_records(uri: str, shard: Shard, rows: Sequence[IndexRow] | None, *, seed: int, label_offset: int = 0,
                  extras: Sequence[schema.ExtraSpec] = ()) -> Iterator[tuple[RecordMeta, bytes]]:
    """(meta, framed record) for every record of a shard in file order; DamagedShard (after the records read
    so far) when the shard or its index rows do not match the manifest."""
    where = shard.path
    offset = count = 0
    try:
        with storage.open_read(uri) as raw:
            reader = DigestingReader(raw)
            for count, data in enumerate(iter_records(reader), start=1):
                framed = frame(data)  # both CRCs were checked, so these are the shard's own bytes
                if rows is None:
                    meta = meta_from_record(data, len(framed), seed, label_offset, extras, where, count - 1)
                else:
                    row = _row(rows, count - 1, offset, len(framed), where)
                    disagrees = identity_problem(row, data, label_offset)
                    if disagrees:
                        raise DamagedShard(f"{where}: record {count - 1}: {disagrees}")
                    meta = meta_from_row(row, len(framed), seed, extras)
                offset += len(framed)
                yield meta, framed
    except FramingError as exc:
        raise DamagedShard(f"{where}: {exc}") from None
    except storage.StorageError as exc:
        raise DamagedShard(f"{where}: cannot read: {storage.problem(exc)}") from None
    _check_whole(shard, count, reader.digest, rows)


def unindexed_shard_records(uri: str, shard: Shard, shard_format: ShardFormat, *, seed: int, label_offset: int = 0,
                            extras: Sequence[schema.ExtraSpec] = ()) -> Iterator[tuple[RecordMeta, bytes]]:
    """(meta, framed record) for every record of a shard of `shard_format` (one no index describes: ArrayRecord) in
    order; DamagedShard when the file or its records do not match the manifest (checked before any record is
    given). A gs:// shard is read once, into a local copy."""
    where = shard.path
    try:
        with array_record.local_copy(uri) as local:
            digest = storage.Digest()
            with storage.open_read(local) as f:
                while block := f.read(storage.READ_CHUNK_SIZE):
                    digest.update(block)
            count = shard_format.count(local, where)
            _check_whole(shard, count, digest, None)
            for i, data in enumerate(shard_format.read(local, where)):
                framed = frame(data)
                yield meta_from_record(data, len(framed), seed, label_offset, extras, where, i), framed
    except shard_format.error as exc:
        raise DamagedShard(str(exc)) from None
    except storage.StorageError as exc:
        raise DamagedShard(f"{where}: cannot read: {storage.problem(exc)}") from None


def _row(rows: Sequence[IndexRow], i: int, offset: int, length: int, where: str) -> IndexRow:
    if i >= len(rows):
        raise DamagedShard(f"{where}: record {i} has no index row (the index lists {len(rows)})")
    row = rows[i]
    if (row.offset, row.length) != (offset, length):
        raise DamagedShard(f"{where}: record {i} is at bytes {offset}..{offset + length}, its index row says "
                           f"{row.offset}..{row.offset + row.length}")
    return row


def _check_whole(shard: Shard, count: int, digest: storage.Digest, rows: Sequence[IndexRow] | None) -> None:
    where = shard.path
    if count != shard.num_records or (rows is not None and len(rows) != count):
        raise DamagedShard(f"{where}: {count} records, the manifest says {shard.num_records}"
                           + (f" and the index {len(rows)}" if rows is not None else ""))
    if digest.size != shard.num_bytes:
        raise DamagedShard(f"{where}: size {digest.size} bytes, the manifest says {shard.num_bytes}")
    if digest.crc32c != shard.crc32c or digest.sha256 != shard.sha256:
        raise DamagedShard(f"{where}: its checksums differ from the manifest's")


def meta_from_row(row: IndexRow, length: int, seed: int, extras: Sequence[schema.ExtraSpec] = ()) -> RecordMeta:
    """A record's metadata from its index row (what the writer wrote it from), ordered by `seed`."""
    values = row.extra or {}
    pairs = []
    for spec in extras:
        value = values.get(field_name(spec.name))
        pairs.append((spec.name, tuple(value) if isinstance(value, list) else (() if value is None else (value,))))
    return RecordMeta(sort_key(seed, row.source_id), row.source_id, length, tuple(row.labels), row.sha256,
                      row.height, row.width, tuple(pairs), row.phash)


def meta_from_record(data: bytes, length: int, seed: int, label_offset: int, extras: Sequence[schema.ExtraSpec],
                     where: str, i: int) -> RecordMeta:
    """A record's metadata from its own fields (a dataset without an index), ordered by `seed`."""
    try:
        fields = schema.decode_lists(data)
    except ValueError as exc:
        raise DamagedShard(f"{where}: record {i}: {exc}") from None

    def text(key: str) -> str:
        return b"".join(fields.get(key, [])).decode("utf-8", "replace")

    def number(key: str) -> int:
        return int((fields.get(key) or [0])[0])

    source_id = text(schema.SOURCE_ID)
    if not source_id:
        raise DamagedShard(f"{where}: record {i} has no {schema.SOURCE_ID}")
    pairs = []
    for spec in extras:
        found = fields.get(spec.key, [])
        pairs.append((spec.name, tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in found)))
    labels = schema.label_ids_of(fields.get(schema.LABEL, []), label_offset)
    return RecordMeta(sort_key(seed, source_id), source_id, length, labels, text(schema.SHA256),
                      number(schema.IMAGE_HEIGHT), number(schema.IMAGE_WIDTH), tuple(pairs))
