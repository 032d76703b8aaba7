"""The per-split record index: one Avro row per record, in shard order, written beside the shards.

The shard writer is the only place that knows where each record lands, so it builds the rows (`row_from_meta`, or
`row_from_record` from an ImageRecord) as it writes, into one part per shard (`index_blocks`); publishing writes the
split's index as one header, then the parts' blocks in shard order. Nothing re-reads shards to make an index. Rows are
plain Avro (deflate): BigQuery, pandas (`DataFrame.from_records(fastavro.reader(f))`) and Spark read them as they are.
Readers must treat rows as untrusted: `check_place`, `identity_problem` and the bounds in `random_access` refuse a row
that does not point at a real record.

Fields, one row per record:
    source_id  string        the record's key (image/source_id): path relative to the input, or a listing's URI
    shard      int           index of the shard within the split (0-based; the manifest lists the shard files)
    offset     long          byte offset of the framed record (TFRecord header included) in the shard file
    length     long          byte length of the framed record: 12 header + data + 4 footer bytes
    label      int           the first label id, 0-based (label_offset removed), -1 when the record has none
    labels     array<int>    every label id, 0-based (one for a single-label dataset, 0..n for multi-label)
    sha256     string        hex SHA-256 of the source file's bytes (image/key/sha256)
    height     int           stored image (or frame) height in pixels
    width      int           stored image (or frame) width in pixels
    phash      string        the image's perceptual signature, 16 hex digits (shard_utils.quality.signature); ""
                             when none was computed (videos, `--validate structure`, indexes written before it)
    extra      record        only when the dataset has extra columns: one field per column (see `field_name`),
                             nullable scalars (null when the row gave no value) or arrays for list columns
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.format import avro_blocks, names
from shard_utils.format.filenames import index_name  # noqa: F401 - a split's index, named where indexes are read
from shard_utils.format.manifest import IndexFile
from shard_utils.format.schema import LABEL, SOURCE_ID, ExtraSpec, ImageRecord, decode_lists, label_ids_of
from shard_utils.format.tfrecord import FOOTER, HEADER, FramingError, masked_crc

__all__ = [
    "index_name", "MIN_FRAMED", "MAX_RECORD_BYTES", "MAX_BLOCK_BYTES", "NO_LABEL", "IndexFormatError", "field_name",
    "index_schema", "IndexRow", "row_from_record", "row_from_meta", "IndexWritten", "write_index", "index_header",
    "index_blocks", "without_header", "check_header", "read_index", "read_places", "check_place", "record_identity",
    "row_disagreement", "identity_problem", "DATA_CHECKSUM_MISMATCH", "unframe"
]

if TYPE_CHECKING:
    from shard_utils.media.encode import RecordMeta

MIN_FRAMED = HEADER + FOOTER  # an empty record
MAX_RECORD_BYTES = 1 << 30  # a framed record longer than this is refused unread (no allocation on a bad row)
MAX_BLOCK_BYTES = 64 * 2**20  # an index block's rows, inflated; the writer makes blocks of about 256 KiB
NO_LABEL = -1
_AVRO_TYPES = {"int64": "long", "float32": "float", "string": "string"}
_REQUIRED = ("source_id", "shard", "offset", "length", "label", "labels", "sha256", "height", "width")
# BigQuery reserves these column-name prefixes (case-insensitively); a sanitized name never starts with one.
_BQ_RESERVED = ("_table_", "_file_", "_partition", "_row_timestamp", "__root__", "_colidentifier")
_MAX_NAME = 300  # BigQuery's column-name limit


class IndexFormatError(ValueError, TpuShardsError):
    """An index file is not a tpu-shards index, or a row does not fit its dataset; the message says which."""


def field_name(column: str) -> str:
    """An extra column's name as an Avro and BigQuery field: letters, digits and '_', not starting with a digit.

    Every other character becomes '_'; a name starting with a digit, or with a prefix BigQuery reserves
    (_TABLE_, _FILE_, _PARTITION, ...), gets 'x_' in front. The original name is kept in the field's doc.
    """
    name = re.sub(r"[^A-Za-z0-9_]", "_", column)
    if not name or name[0].isdigit() or name.lower().startswith(_BQ_RESERVED):
        name = "x_" + name
    if len(name) > _MAX_NAME:
        raise IndexFormatError(f"extra column {column[:60]!r}... is longer than {_MAX_NAME} characters; "
                               "rename it in the listing")
    return name


def _extra_fields(extras: Sequence[ExtraSpec]) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for spec in extras:
        name = field_name(spec.name)
        if name.lower() in seen:  # BigQuery column names are case-insensitive
            raise IndexFormatError(f"extra columns {seen[name.lower()]!r} and {spec.name!r} both become the index "
                                   f"field {name!r}; rename one of them in the listing")
        seen[name.lower()] = spec.name
        if spec.dtype not in _AVRO_TYPES:
            raise IndexFormatError(f"extra column {spec.name!r} has dtype {spec.dtype!r}; "
                                   f"expected one of {', '.join(_AVRO_TYPES)}")
        avro = _AVRO_TYPES[spec.dtype]
        kind: Any = {"type": "array", "items": avro} if spec.is_list else ["null", avro]
        entry = {"name": name, "type": kind, "doc": f"{spec.key} ({spec.dtype}{', list' if spec.is_list else ''})"}
        entry["default"] = [] if spec.is_list else None
        fields.append(entry)
    return fields


def index_schema(extras: Sequence[ExtraSpec] = ()) -> dict[str, Any]:
    """The Avro schema of a split's index; extras adds the `extra` record (one field per column)."""
    fields: list[dict[str, Any]] = [
        {"name": "source_id", "type": "string", "doc": "image/source_id: the record's key"},
        {"name": "shard", "type": "int", "doc": "shard index within the split"},
        {"name": "offset", "type": "long", "doc": "byte offset of the framed record in the shard file"},
        {"name": "length", "type": "long", "doc": "byte length of the framed record (12 + data + 4)"},
        {"name": "label", "type": "int", "doc": "first label id, 0-based; -1 when none"},
        {"name": "labels", "type": {"type": "array", "items": "int"}, "doc": "every label id, 0-based"},
        {"name": "sha256", "type": "string", "doc": "hex SHA-256 of the source file"},
        {"name": "height", "type": "int", "doc": "stored height in pixels"},
        {"name": "width", "type": "int", "doc": "stored width in pixels"},
        {"name": "phash", "type": "string", "default": "",
         "doc": "perceptual signature, 16 hex digits; empty when none was computed"},
    ]
    if extras:
        fields.append({"name": "extra", "doc": "the listing's extra columns (extra/<name> in records)",
                       "type": {"type": "record", "name": "Extra", "fields": _extra_fields(extras)}})
    return {"type": "record", "name": "IndexRow", "namespace": "tpu_shards",
            "doc": "one row per record of a split, in shard order", "fields": fields}


@dataclass(frozen=True)
class IndexRow:
    """One record's row. `extra` maps field names (`field_name`) to a value, None, or a list."""

    source_id: str
    shard: int
    offset: int
    length: int
    label: int
    labels: tuple[int, ...]
    sha256: str
    height: int
    width: int
    extra: Mapping[str, Any] | None = field(default=None)
    phash: str = ""

    def to_avro(self) -> dict[str, Any]:
        row = {"source_id": self.source_id, "shard": self.shard, "offset": self.offset, "length": self.length,
               "label": self.label, "labels": list(self.labels), "sha256": self.sha256, "height": self.height,
               "width": self.width, "phash": self.phash}
        if self.extra is not None:
            row["extra"] = dict(self.extra)
        return row

    @classmethod
    def from_avro(cls, row: Mapping[str, Any]) -> IndexRow:
        extra = row.get("extra")
        return cls(row["source_id"], row["shard"], row["offset"], row["length"], row["label"],
                   tuple(row["labels"]), row["sha256"], row["height"], row["width"],
                   dict(extra) if extra is not None else None, row.get("phash") or "")


def row_from_record(shard: int, offset: int, framed_length: int, record: ImageRecord,
                    label_offset: int = 0) -> IndexRow:
    """The row of a record as the writer frames it: `record` as stored (its label ids include label_offset)."""
    labels = label_ids_of(record.label_ids, label_offset)
    if any(i < 0 for i in labels):
        raise ValueError(f"record {record.source_id!r}: stored label ids {record.label_ids} are below "
                         f"label_offset {label_offset}")
    return _row(shard, offset, framed_length, record.source_id, labels, record.sha256, record.height, record.width,
                record.extras)


def row_from_meta(shard: int, offset: int, meta: RecordMeta, extras: Sequence[ExtraSpec] = (), *,
                  multi_label: bool) -> IndexRow:
    """The row of a record from the metadata the shard writer holds (`encode.RecordMeta`: 0-based label ids,
    the framed length, and the item's extra values, which `extras` types as the records do). A single-label
    record stores only the item's first label, and so does its row."""
    values = dict(meta.extras)
    pairs = [(spec, tuple(values.get(spec.name, ()))) for spec in extras]
    labels = tuple(meta.labels) if multi_label else tuple(meta.labels[:1])
    return _row(shard, offset, meta.length, meta.source_id, labels, meta.sha256, meta.height, meta.width, pairs,
                meta.phash)


_CASTS = {"int64": int, "float32": float, "string": str}


def _row(shard: int, offset: int, length: int, source_id: str, labels: tuple[int, ...], sha256: str, height: int,
         width: int, extras: Iterable[tuple[ExtraSpec, tuple]], phash: str = "") -> IndexRow:
    if length < MIN_FRAMED or offset < 0:
        raise ValueError(f"record {source_id!r}: offset {offset} / framed length {length} is not a "
                         "framed record's place")
    extra = None
    for spec, values in extras:
        cast = _CASTS[spec.dtype]
        typed = [cast(v) for v in values]
        extra = extra if extra is not None else {}
        extra[field_name(spec.name)] = typed if spec.is_list else (typed[0] if typed else None)
    return IndexRow(source_id, shard, offset, length, labels[0] if labels else NO_LABEL, labels, sha256, height,
                    width, extra, phash)


@dataclass(frozen=True)
class IndexWritten:
    """What `write_index` wrote: rows, and the file's size and checksums for the manifest."""

    num_rows: int
    num_bytes: int
    crc32c: str
    sha256: str

    def index_file(self, path: str) -> IndexFile:
        """The manifest's entry for this index at `path` (relative to the dataset folder)."""
        return IndexFile(path, self.num_rows, self.num_bytes, self.crc32c, self.sha256)


class _Digesting:
    """A write-only file that digests what passes through it."""

    def __init__(self, fileobj: BinaryIO):
        self._f = fileobj
        self.digest = storage.Digest()

    def write(self, data: bytes) -> int:
        self.digest.update(bytes(data))
        self._f.write(data)
        return len(data)

    def seekable(self) -> bool:  # fastavro asks, to decide whether it appends to an existing file
        return False

    def flush(self) -> None:
        if hasattr(self._f, "flush"):
            self._f.flush()


_CODEC, _SYNC_INTERVAL = "deflate", 1 << 18  # how every index file is written, row by row or merged


_FIELD_ORDER = ("doc", "aliases", "default", "name", "type")  # last in a parsed field, in this order


def _parsed_for_writing(schema: Mapping[str, Any]) -> dict[str, Any]:
    """fastavro's parsed schema, every field's keys in one order. The file's header is that schema as JSON, and
    fastavro places a field's doc, aliases and default by iterating a set, whose order changes with each
    process's string hashing: a field with both a doc and a default (phash, extras) gave another header."""
    import fastavro

    parsed = fastavro.parse_schema(dict(schema))
    _order_fields(parsed)
    return cast(dict[str, Any], parsed)


def _order_fields(node: Any) -> None:
    """Move each record field's keys in _FIELD_ORDER to its end, in place (the parsed schema keeps its
    identity: fastavro's named types point into it)."""
    if isinstance(node, list):
        for item in node:
            _order_fields(item)
    elif isinstance(node, dict):
        for entry in node.get("fields", ()) if node.get("type") == "record" else ():
            for key in _FIELD_ORDER:
                if key in entry:
                    entry[key] = entry.pop(key)
            _order_fields(entry["type"])
        if node.get("type") in ("array", "map"):
            _order_fields(node.get("items", node.get("values")))


def _sync_marker(schema: Mapping[str, Any]) -> bytes:
    """Avro's block separator, derived from the schema so the same rows give byte-identical files."""
    return hashlib.sha256(b"tpu-shards index\0" + json.dumps(schema, sort_keys=True).encode()).digest()[:16]


def write_index(fileobj: BinaryIO, rows: Iterable[IndexRow], schema: Mapping[str, Any]) -> IndexWritten:
    """Stream rows into an Avro file (deflate), holding one block at a time; returns counts and checksums.

    The file is deterministic: the same rows and schema always give the same bytes.
    """
    import fastavro

    parsed = _parsed_for_writing(schema)
    out = _Digesting(fileobj)
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        for row in rows:
            count += 1
            yield row.to_avro()

    fastavro.writer(cast(IO[bytes], out), parsed, records(), codec=_CODEC, sync_interval=_SYNC_INTERVAL,
                    sync_marker=_sync_marker(schema), strict=True)
    out.flush()
    return IndexWritten(count, out.digest.size, out.digest.crc32c, out.digest.sha256)


def index_header(schema: Mapping[str, Any]) -> bytes:
    """The bytes every index file with this schema starts with (magic, schema, codec, sync marker)."""
    import io

    import fastavro

    buffer = io.BytesIO()
    fastavro.writer(buffer, _parsed_for_writing(schema), [], codec=_CODEC, sync_interval=_SYNC_INTERVAL,
                    sync_marker=_sync_marker(schema), strict=True)
    return buffer.getvalue()


def index_blocks(rows: Iterable[IndexRow], schema: Mapping[str, Any]) -> bytes:
    """The rows as Avro blocks without the header: a split's index is `index_header` followed by every shard's
    blocks in shard order (the same sync marker makes that one valid file)."""
    import io

    buffer = io.BytesIO()
    write_index(buffer, rows, schema)
    header = index_header(schema)
    data = buffer.getvalue()
    if not data.startswith(header):
        raise IndexFormatError("the index writer's header changed between two files of one schema")
    return data[len(header):]


def without_header(data: bytes, header: bytes) -> bytes:
    """An index part's blocks: the part as `index_blocks` wrote it, or a whole index file with this header."""
    if data.startswith(header):
        return data[len(header):]
    if data.startswith(b"Obj\x01"):
        raise IndexFormatError("an index part was written with another schema or sync marker than its split's index")
    return data


def _rows(reader) -> Iterator[dict[str, Any]]:
    try:
        yield from reader
    except IndexFormatError:
        raise
    except Exception as exc:  # a damaged block: fastavro raises many types
        raise IndexFormatError(f"index file is damaged: {storage.problem(exc)}") from None


def _bounded_rows(fileobj: BinaryIO, reader_schema: Mapping[str, Any] | None,
                  max_rows: int | None) -> Iterator[dict[str, Any]]:
    """The rows of an index file, block by block. Each block's declared row count (against `max_rows`) and size
    (against MAX_BLOCK_BYTES, compressed and not) are checked before it is read and inflated, so no size written
    in the file is allocated unchecked (see avro_blocks); fastavro reads the header and decodes the rows."""
    import fastavro

    stream = avro_blocks.Recent(fileobj)
    writer_schema, codec = _header(stream)
    sync, seen = stream.tail, 0
    reader = fastavro.parse_schema(dict(reader_schema)) if reader_schema is not None else None
    while (header := _framing(avro_blocks.block_header, stream, MAX_BLOCK_BYTES)) is not None:
        count, size = header
        if max_rows is not None and count > max_rows - seen:
            raise _damaged(f"a block declares {count} rows, which makes more than the {max_rows} the manifest lists")
        block = io.BytesIO(_framing(avro_blocks.block_body, stream, size, codec, sync, MAX_BLOCK_BYTES))
        for _ in range(count):
            yield cast(dict[str, Any], fastavro.schemaless_reader(block, writer_schema, reader))
        if block.tell() != len(block.getbuffer()):
            raise _damaged(f"a block holds bytes after its {count} rows")
        seen += count


def _framing(step, *args):
    """One avro_blocks step, its BlockError as an IndexFormatError saying the index is damaged."""
    try:
        return step(*args)
    except avro_blocks.BlockError as exc:
        raise _damaged(str(exc)) from None


def _header(stream: avro_blocks.Recent) -> tuple[dict[str, Any], str]:
    """The parsed writer schema and the codec of an index file, after checking it is a tpu-shards index."""
    import fastavro

    try:
        header = fastavro.block_reader(cast(IO[bytes], stream))  # reads the header only
        written, codec = header.writer_schema, header.metadata.get("avro.codec", "null")
    except Exception as exc:
        raise IndexFormatError(f"not an Avro index file: {storage.problem(exc)}") from None
    fields = written.get("fields", []) if isinstance(written, dict) else []
    names = {f["name"] for f in fields if isinstance(f, dict)}
    missing = [f for f in _REQUIRED if f not in names]
    if missing:
        raise IndexFormatError(f"not a tpu-shards index: fields {', '.join(missing)} are missing")
    if codec not in ("null", "deflate"):
        raise IndexFormatError(f"the index is compressed with {codec!r}; tpu-shards writes null or deflate")
    return cast(dict[str, Any], fastavro.parse_schema(written)), codec


def _damaged(problem: str) -> IndexFormatError:
    return IndexFormatError(f"index file is damaged: {problem}")


def check_header(fileobj: IO[bytes]) -> None:
    """Read only an index file's header: IndexFormatError unless it is a tpu-shards index."""
    _header(avro_blocks.Recent(cast(BinaryIO, fileobj)))


def read_index(fileobj: BinaryIO, max_rows: int | None = None) -> Iterator[IndexRow]:
    """Stream an index's rows in file order; IndexFormatError if it is not a readable tpu-shards index, or holds
    more than `max_rows` rows (the manifest's count: pass it whenever the index comes from a dataset)."""
    for row in _rows(_bounded_rows(fileobj, None, max_rows)):
        yield IndexRow.from_avro(row)


_PLACE_SCHEMA = {"type": "record", "name": "IndexRow", "namespace": "tpu_shards", "fields": [
    {"name": "shard", "type": "int"}, {"name": "offset", "type": "long"}, {"name": "length", "type": "long"}]}


def read_places(fileobj: BinaryIO, max_rows: int | None = None) -> Iterator[tuple[int, int, int]]:
    """Stream (shard, offset, length) of each row, decoding only those three fields (`max_rows` as in read_index)."""
    for row in _rows(_bounded_rows(fileobj, _PLACE_SCHEMA, max_rows)):
        yield row["shard"], row["offset"], row["length"]


def check_place(offset: int, length: int, shard_bytes: int, max_record_bytes: int = MAX_RECORD_BYTES) -> str | None:
    """Why a row's (offset, length) cannot be a framed record in a shard of shard_bytes bytes, or None."""
    if length < MIN_FRAMED:
        return f"length {length} is shorter than a framed record ({MIN_FRAMED} bytes)"
    if length > max_record_bytes:
        return f"length {length} exceeds the {max_record_bytes}-byte limit of one record"
    if offset < 0 or offset + length > shard_bytes:
        return f"bytes {offset}..{offset + length} fall outside the shard's {shard_bytes} bytes"
    return None


def record_identity(record: bytes, label_offset: int = 0) -> tuple[str, tuple[int, ...]]:
    """A serialized record's source id and 0-based label ids; ValueError when it is not a tf.train.Example."""
    fields = decode_lists(record)
    return (b"".join(fields.get(SOURCE_ID, [])).decode("utf-8", "replace"),
            label_ids_of(fields.get(LABEL, []), label_offset))


def row_disagreement(row: IndexRow, source_id: str, labels: tuple[int, ...]) -> str | None:
    """How a row's source id and labels differ from its record's, or None. Those are what tools take from the
    index instead of the record (append's source ids, reshard's labels), so a row must never win over its record."""
    if row.source_id != source_id:
        return f"its index row gives source id {names.shown(row.source_id)}, the record {names.shown(source_id)}"
    if row.labels != labels or row.label != (labels[0] if labels else NO_LABEL):
        return f"its index row gives labels {list(row.labels)}, the record {list(labels)}"
    return None


def identity_problem(row: IndexRow, record: bytes, label_offset: int = 0) -> str | None:
    """`row_disagreement` with the record's own fields, or why the record has none (not a tf.train.Example)."""
    try:
        return row_disagreement(row, *record_identity(record, label_offset))
    except ValueError as exc:
        return str(exc)


DATA_CHECKSUM_MISMATCH = "data checksum mismatch"  # unframe's finding when the length holds and the data does not


def unframe(framed: bytes) -> bytes:
    """The record inside one framed record, after checking its length, both CRCs and that nothing is left over."""
    if len(framed) < MIN_FRAMED:
        raise FramingError(f"{len(framed)} bytes are too short for a framed record")
    length_bytes, (length_crc,) = framed[:8], struct.unpack("<I", framed[8:HEADER])
    if masked_crc(length_bytes) != length_crc:
        raise FramingError("length checksum mismatch (not the start of a record)")
    (length,) = struct.unpack("<Q", length_bytes)
    if length != len(framed) - MIN_FRAMED:
        raise FramingError(f"record holds {length} bytes but the index gives it {len(framed) - MIN_FRAMED}")
    data = framed[HEADER:HEADER + length]
    if masked_crc(data) != struct.unpack("<I", framed[HEADER + length:])[0]:
        raise FramingError(DATA_CHECKSUM_MISMATCH)
    return data
