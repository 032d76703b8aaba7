"""Label ids (numeric labels keep their numbers) and records without a label: pure functions, no build."""
from __future__ import annotations

import json

import pytest
from conftest import photo

from beam_jobs.jobs.summary import label_ids_line
from shard_utils.format import index, labels, schema
from shard_utils.format.index import unframe
from shard_utils.format.manifest import ManifestError, parse
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import Encoded, EncodeSettings, encode_data


def test_integer_labels_take_ids_in_numeric_order_and_others_string_order():
    twelve = [str(i) for i in range(12)]
    assert labels.label_order(reversed(twelve)) == twelve  # 7 is id 7, 11 is id 11 (string order: id 3)
    assert labels.label_order({"3", "9", "5"}) == ["3", "5", "9"] and labels.label_order({"10", "9", "-1"}) == \
        ["-1", "9", "10"]
    for mixed in ({"1", "007"}, {"1", "+2"}, {"1", "2.0"}, {"1", "cat"}, {"-0", "1"}):  # not one plain integer each
        assert labels.label_order(mixed) == sorted(mixed)
    assert labels.label_order({"dog", "cat"}) == ["cat", "dog"]


def test_an_append_keeps_ids_and_puts_new_labels_after_in_the_same_order_rule():
    assert labels.label_order({"12", "3", "0"}, ["0", "1", "2", "3"]) == ["0", "1", "2", "3", "12"]
    assert labels.label_order({"4", "10"}, ["3", "5"]) == ["3", "5", "4", "10"]  # existing ids never move
    assert labels.label_order({"ant", "10"}, ["3", "5"]) == ["3", "5", "10", "ant"]


def test_the_summary_names_the_mapping_only_when_an_id_is_not_its_label():
    assert label_ids_line([str(i) for i in range(12)]) == [] and label_ids_line(["cat", "dog"]) == []
    [line] = label_ids_line(["3", "5", "9"])
    assert line.startswith("  label ids: 3→0, 5→1, 9→2 (")
    assert labels.renumbered([str(i) for i in range(1, 20)], limit=3) == "1→0, 2→1, 3→2 and 16 more"


def _encode(item: MediaItem, ids: dict[str, int], tmp_path, offset: int = 0):
    path = tmp_path / "a.jpg"
    photo(16, 16, 1).save(path, "JPEG", quality=90)
    return encode_data(item, EncodeSettings(label_ids=ids, label_offset=offset), path.read_bytes())


@pytest.mark.parametrize("offset", [0, 1])
def test_an_item_without_a_label_in_an_unlabeled_build_stores_no_label(tmp_path, offset):
    item = MediaItem("te1.jpg", str(tmp_path / "a.jpg"), 0, (), no_label=("no_label", "file sits directly ..."))
    out = _encode(item, {}, tmp_path, offset)
    assert isinstance(out, Encoded) and out.meta.labels == ()
    fields = schema.decode_lists(unframe(out.framed))
    assert fields[schema.LABEL] == [schema.NO_LABEL + offset] and fields[schema.LABEL_TEXT] == [b""]
    assert schema.label_ids_of(fields[schema.LABEL], offset) == ()
    row = index.row_from_meta(0, 0, out.meta, multi_label=True)
    assert (row.label, row.labels) == (index.NO_LABEL, ())


def test_an_item_without_a_label_in_a_labeled_build_is_rejected_as_it_says(tmp_path):
    item = MediaItem("dog/1.jpg", str(tmp_path / "a.jpg"), 0, (), origin="a.csv line 4",
                     no_label=("bad_row", "empty label in column 'label'"))
    assert _encode(item, {"cat": 0}, tmp_path) == {
        "source": "dog/1.jpg", "reason": "bad_row", "message": "a.csv line 4: empty label in column 'label'"}


def _manifest(unlabeled: int, class_counts: dict | None = None) -> dict:
    shard = {"path": "test-00000-of-00001.tfrecord", "num_records": 4, "num_bytes": 400, "crc32c": "AAAAAA==",
             "sha256": "0" * 64}
    split = {"num_records": 4, "num_bytes": 400, "class_counts": class_counts or {}, "shards": [shard],
             "unlabeled": unlabeled}
    return {"format_version": 2, "options": {}, "features": schema.feature_table(), "labels": list(class_counts or []),
            "splits": {"test": split}, "rejected": {"count": 0}, "skipped": {"count": 0}, "files_seen": 4}


def test_the_manifest_counts_unlabeled_records_per_split_and_checks_the_count():
    m = parse(json.dumps(_manifest(4)))
    assert m.split("test").unlabeled == 4 and not m.split("test").labeled
    assert m.to_dict()["splits"]["test"]["unlabeled"] == 4
    plain = json.loads(m.to_json())
    plain["splits"]["test"].pop("unlabeled")
    assert parse(json.dumps(plain)).split("test").labeled  # a manifest written before unlabeled records
    with pytest.raises(ManifestError, match="unlabeled 5 is more than its 4 records"):
        parse(json.dumps(_manifest(5)))
    with pytest.raises(ManifestError, match="class_counts add up to 3, and 2 records are unlabeled"):
        parse(json.dumps(_manifest(2, {"cat": 3})))
