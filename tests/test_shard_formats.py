"""The shard format registry and its adapters: every format is listed once, and each writes, reads back, counts
and refuses a damaged shard of its own on local files."""
from __future__ import annotations

import hashlib

import pytest

from shard_utils.format import filenames, shard_formats
from shard_utils.format.shard_formats import ARRAY_RECORD, FORMATS, TFRECORD
from shard_utils.format.tfrecord import frame

RECORDS = [b"", b"a", b"\x00\xff" * 300, bytes(range(256)) * 40]


def test_the_registry_lists_both_formats_in_manifest_order():
    assert list(FORMATS) == ["tfrecord", "array_record"]
    assert shard_formats.FIRST is TFRECORD
    assert shard_formats.OPTIONS == ("tfrecord", "array_record", "both")
    assert [shard_formats.formats_of(o) for o in shard_formats.OPTIONS] == [
        ("tfrecord",), ("array_record",), ("tfrecord", "array_record")]
    assert [shard_formats.option_of(shard_formats.formats_of(o)) for o in shard_formats.OPTIONS] == list(
        shard_formats.OPTIONS)
    with pytest.raises(ValueError, match="not one of tfrecord, array_record"):
        shard_formats.get("parquet")


@pytest.mark.parametrize("shard_format", list(FORMATS.values()), ids=list(FORMATS))
def test_each_format_round_trips_its_records(tmp_path, shard_format):
    dst = str(tmp_path / shard_format.shard_name("train", 0, 1))
    written = shard_format.write(iter(RECORDS), dst)
    data = open(dst, "rb").read()
    assert (written.num_records, written.num_bytes, written.sha256) == (
        len(RECORDS), len(data), hashlib.sha256(data).hexdigest())
    assert list(shard_format.read(dst)) == RECORDS
    assert shard_format.count(dst) == len(RECORDS)
    assert shard_formats.of_shard(dst.rpartition("/")[2]) is shard_format


def test_tfrecord_shards_are_the_framed_records_back_to_back(tmp_path):
    dst = str(tmp_path / "x-00000-of-00001.tfrecord")
    TFRECORD.write(RECORDS, dst)
    assert open(dst, "rb").read() == b"".join(frame(r) for r in RECORDS)


@pytest.mark.parametrize("shard_format", list(FORMATS.values()), ids=list(FORMATS))
def test_a_cut_shard_is_refused_by_name(tmp_path, shard_format):
    dst = str(tmp_path / shard_format.shard_name("train", 0, 1))
    shard_format.write(RECORDS, dst)
    with open(dst, "r+b") as f:
        f.truncate(len(f.read()) - 5)
    with pytest.raises(shard_format.error, match="the-shard"):
        shard_format.count(dst, "the-shard")
    with pytest.raises(shard_format.error, match="the-shard"):
        list(shard_format.read(dst, "the-shard"))


def test_names_come_from_filenames_with_each_formats_extension():
    assert TFRECORD.shard_name("train", 3, 8) == "train-00003-of-00008.tfrecord"
    assert TFRECORD.shard_name("train", 3, 8, "tfrec", generation=2) == "train-g002-00003-of-00008.tfrec"
    assert ARRAY_RECORD.twin_name("train-00003-of-00008.tfrec") == "train-00003-of-00008.array_record"
    assert ARRAY_RECORD.extension_of("train-00003-of-00008.tfrecord") is None
    assert TFRECORD.extension_of("a.b-00000-of-00001.tfrec") == "tfrec"
    assert shard_formats.of_shard(filenames.index_name("train")) is None
    with pytest.raises(ValueError, match="not 'array_record'"):
        TFRECORD.shard_name("train", 0, 1, "array_record")
    with pytest.raises(ValueError, match="is not a TFRecord shard name"):
        ARRAY_RECORD.twin_name("train-00000-of-00001.array_record")
