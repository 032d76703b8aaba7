"""The Avro record index: schema, rows from records, streaming write and read, framing checks."""
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest
from index_helpers import image_record

from shard_utils import storage
from shard_utils.format import index
from shard_utils.format.index import IndexFormatError, IndexRow
from shard_utils.format.schema import ExtraSpec, encode_example
from shard_utils.format.tfrecord import FramingError, frame

LABELS = ["cat", "dog", "fish"]
EXTRAS = [ExtraSpec("bbox", "float32", True), ExtraSpec("2nd score", "int64"), ExtraSpec("note", "string")]


def row(i, shard=0, extra=None):
    return IndexRow(f"img/{i}.jpg", shard, i * 100, 100, i % 3, (i % 3,), "ab" * 32, 16, 24, extra)


def written(rows, schema):
    buf = io.BytesIO()
    result = index.write_index(buf, iter(rows), schema)
    return buf.getvalue(), result


def test_extra_names_become_bigquery_friendly_fields():
    fields = {f["name"]: f for f in index.index_schema(EXTRAS)["fields"]}
    extra = {f["name"]: f for f in fields["extra"]["type"]["fields"]}
    assert list(extra) == ["bbox", "x_2nd_score", "note"]
    assert extra["bbox"]["type"] == {"type": "array", "items": "float"}
    assert extra["x_2nd_score"]["type"] == ["null", "long"] and "extra/2nd score" in extra["x_2nd_score"]["doc"]
    assert index.field_name("_TABLE_suffix") == "x__TABLE_suffix"
    assert index.field_name("weird/na-me é") == "weird_na_me__"
    assert "extra" not in {f["name"] for f in index.index_schema()["fields"]}


@pytest.mark.parametrize("a, b", [("a b", "a-b"), ("Score", "score")])
def test_colliding_extra_names_are_refused(a, b):
    with pytest.raises(IndexFormatError, match="rename one"):
        index.index_schema([ExtraSpec(a, "int64"), ExtraSpec(b, "int64")])


def test_rows_round_trip_and_checksums_match_the_bytes():
    schema = index.index_schema(EXTRAS)
    rows = [row(i, extra={"bbox": [0.5, 1.25], "x_2nd_score": None if i % 2 else i, "note": "é"}) for i in range(50)]
    data, result = written(rows, schema)
    assert list(index.read_index(io.BytesIO(data))) == rows
    assert list(index.read_places(io.BytesIO(data))) == [(0, i * 100, 100) for i in range(50)]
    digest = storage.Digest()
    digest.update(data)
    assert (result.num_rows, result.num_bytes, result.crc32c, result.sha256) == (50, len(data), digest.crc32c,
                                                                                digest.sha256)
    entry = result.index_file("train.index.avro")
    assert (entry.path, entry.num_rows, entry.num_bytes) == ("train.index.avro", 50, len(data))
    assert written(rows, schema)[0] == data  # deterministic: the same rows give the same bytes
    assert fastavro.reader(io.BytesIO(data)).codec == "deflate"


def test_the_header_is_the_same_whatever_the_process_string_hashing():
    """fastavro places a field's doc and default in a set's order, which string hashing changes: processes
    seeded 0 and 1 wrote two headers for one schema (so one dataset's index bytes changed with the worker)."""
    code = ("import sys; from shard_utils.format import index; from shard_utils.format.schema import ExtraSpec; "
            "sys.stdout.write(index.index_header(index.index_schema([ExtraSpec('note', 'string')])).hex())")
    headers = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                              cwd=Path(__file__).resolve().parents[1],
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("0", "1")}
    assert headers == {index.index_header(index.index_schema([ExtraSpec("note", "string")])).hex()}


def test_rows_are_plain_avro_records():
    signed = IndexRow("img/2.jpg", 0, 200, 100, 2, (2,), "ab" * 32, 16, 24, phash="0123456789abcdef")
    data, _ = written([row(1), signed], index.index_schema())
    plain = list(fastavro.reader(io.BytesIO(data)))
    assert plain[1] == {"source_id": "img/2.jpg", "shard": 0, "offset": 200, "length": 100, "label": 2,
                        "labels": [2], "sha256": "ab" * 32, "height": 16, "width": 24, "phash": "0123456789abcdef"}
    assert plain[0]["phash"] == ""


def test_an_index_written_before_the_signature_field_still_reads():
    schema = index.index_schema()
    schema = {**schema, "fields": [f for f in schema["fields"] if f["name"] != "phash"]}
    rows = [row(i) for i in range(3)]
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema), [{k: v for k, v in r.to_avro().items() if k != "phash"}
                                                          for r in rows])
    assert list(index.read_index(io.BytesIO(buf.getvalue()))) == rows  # phash "" where the file has none


def test_pandas_reads_rows_as_they_are():
    pandas = pytest.importorskip("pandas")
    data, _ = written([row(i) for i in range(5)], index.index_schema())
    frame_ = pandas.DataFrame.from_records(fastavro.reader(io.BytesIO(data)))
    assert list(frame_["offset"]) == [0, 100, 200, 300, 400]


class CountingSink(io.RawIOBase):
    """A write-only sink that remembers how many rows had been produced at each write."""

    def __init__(self, produced):
        self.produced, self.at_write, self.data = produced, [], bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.at_write.append(self.produced[0])
        self.data += b
        return len(b)


def test_write_streams_rows_in_blocks():
    produced = [0]
    total = 30_000

    def rows():
        for i in range(total):
            produced[0] += 1
            yield IndexRow(f"folder/{i:08d}-{i * 7919 % 100003}.jpg", i // 1000, i * 5000, 5000, i % 10, (i % 10,),
                           f"{i:064x}", 224, 224)

    sink = CountingSink(produced)
    result = index.write_index(sink, rows(), index.index_schema())
    assert result.num_rows == total
    assert any(0 < n < total for n in sink.at_write)  # blocks reached the file while rows were still coming
    reader = io.BytesIO(bytes(sink.data))
    first = next(index.read_index(reader))
    assert first.source_id == "folder/00000000-0.jpg" and reader.tell() < len(sink.data)  # read streams too


def test_row_from_record_single_multi_offset_and_extras():
    single = image_record(1, [2], LABELS, label_offset=1)
    framed = frame(encode_example(single))
    r = index.row_from_record(3, 4096, len(framed), single, label_offset=1)
    assert (r.shard, r.offset, r.length, r.label, r.labels) == (3, 4096, len(framed), 2, (2,))
    assert (r.source_id, r.sha256, r.height, r.width, r.extra) == (single.source_id, single.sha256, 16, 24, None)

    extras = ((EXTRAS[0], (1.5, 2.0)), (EXTRAS[1], ()), (EXTRAS[2], ("x",)))
    multi = image_record(2, [0, 2], LABELS, multi_label=True, extras=extras)
    r = index.row_from_record(0, 0, 99, multi)
    assert (r.label, r.labels) == (0, (0, 2))
    assert r.extra == {"bbox": [1.5, 2.0], "x_2nd_score": None, "note": "x"}
    none = index.row_from_record(0, 0, 99, image_record(3, [], LABELS, multi_label=True))
    assert (none.label, none.labels) == (-1, ())
    # With label_offset 1 a stored 0 is id -1, a record without a label; anything lower is refused.
    unlabeled = index.row_from_record(0, 0, 99, image_record(4, [0], LABELS), label_offset=1)
    assert (unlabeled.label, unlabeled.labels) == (-1, ())
    with pytest.raises(ValueError, match="below label_offset"):
        index.row_from_record(0, 0, 99, image_record(4, [0], LABELS), label_offset=2)


def test_foreign_and_damaged_files_are_refused():
    with pytest.raises(IndexFormatError, match="not an Avro index"):
        list(index.read_index(io.BytesIO(b"PAR1 not avro at all")))
    other = io.BytesIO()
    fastavro.writer(other, fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": "int"}]}), [{"x": 1}])
    with pytest.raises(IndexFormatError, match="fields source_id, shard"):
        list(index.read_index(io.BytesIO(other.getvalue())))
    data, _ = written([row(i) for i in range(500)], index.index_schema())
    cut = data[:len(data) * 2 // 3]
    with pytest.raises(IndexFormatError, match="damaged"):
        list(index.read_index(io.BytesIO(cut)))


def test_unframe_checks_both_crcs_and_the_length():
    framed = frame(b"hello record")
    assert index.unframe(framed) == b"hello record"
    for at, message in ((2, "length checksum"), (len(framed) - 6, "data checksum")):
        bad = bytearray(framed)
        bad[at] ^= 1
        with pytest.raises(FramingError, match=message):
            index.unframe(bytes(bad))
    with pytest.raises(FramingError, match="index gives it"):
        index.unframe(framed + frame(b"next")[:4])
    with pytest.raises(FramingError, match="too short"):
        index.unframe(framed[:10])


@pytest.mark.parametrize("offset, length, size, reason", [
    (0, 15, 100, "shorter than a framed record"), (90, 20, 100, "outside"), (-1, 20, 100, "outside"),
    (0, 1 << 40, 1 << 41, "exceeds")])
def test_check_place_refuses_rows_outside_the_shard(offset, length, size, reason):
    assert reason in index.check_place(offset, length, size)
    assert index.check_place(0, 100, 100) is None


def encoded_item(tmp_path, extras_values, settings):
    from conftest import photo

    from shard_utils.inputs import MediaItem
    from shard_utils.media.encode import encode_item

    path = tmp_path / "cat.jpg"
    photo(40, 30, seed=1).save(path, "JPEG", quality=90)
    item = MediaItem("x/cat.jpg", str(path), path.stat().st_size, ("dog", "cat"), extras=extras_values)
    return encode_item(item, settings)


@pytest.mark.parametrize("label_offset", [0, 1])
def test_the_writers_row_agrees_with_the_record(tmp_path, label_offset):
    """The shard writer builds rows from RecordMeta (every label of the item, as every record stores them)."""
    from index_helpers import record_of

    from shard_utils.format import manifest as manifest_mod
    from shard_utils.format.schema import LABEL, feature_table
    from shard_utils.media.encode import EncodeSettings

    settings = EncodeSettings(label_ids={"cat": 0, "dog": 1}, label_offset=label_offset, extras=tuple(EXTRAS))
    raw = (("bbox", (1, "2.5")), ("2nd score", ("7",)), ("note", (3,)))  # as a listing gives them: untyped
    enc = encoded_item(tmp_path, raw, settings)
    row = index.row_from_meta(2, 512, enc.meta, EXTRAS, multi_label=True)
    features = feature_table(multi_label=True, extras=EXTRAS, max_lengths={"extra/bbox": 2, LABEL: 2})
    m = manifest_mod.Manifest("t", "", "", {}, features, ["cat", "dog"], {}, {"count": 0}, {"count": 0}, 0,
                              label_offset=label_offset, multi_label=True)
    record = record_of(index.unframe(enc.framed), m)
    assert len(row.phash) == 16  # the signature is the index's alone: the record does not hold it
    assert dataclasses.replace(row, phash="") == index.row_from_record(2, 512, len(enc.framed), record, label_offset)
    assert row.extra == {"bbox": [1.0, 2.5], "x_2nd_score": 7, "note": "3"}
    assert row.labels == (1, 0) and row.label == 1

