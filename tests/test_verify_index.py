"""`verify` on a split's record index: the file against the manifest, every row against its record."""
import dataclasses
import json
import shutil

import pytest
from conftest import run_cli, run_job, write_images
from index_helpers import add_index, rewrite_index

from shard_utils.format import manifest as manifest_mod
from shard_utils.read.verify import MAX_INDEX_PROBLEMS, check_index, verify


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    base = tmp_path_factory.mktemp("verify_index")
    write_images(base / "in", {"a": 9, "b": 9})
    run_job(base / "in", base / "out", "--num-cores", "2")
    add_index(base / "out")
    return base / "out"


@pytest.fixture
def copy(dataset, tmp_path):
    shutil.copytree(dataset, tmp_path / "ds")
    return tmp_path / "ds"


def moved(row, **changes):
    return dataclasses.replace(row, **changes)


def index_problems(path, deep=False):
    return check_index(manifest_mod.load(str(path)), "train", deep)


@pytest.mark.slow
def test_intact_index_verifies(dataset):
    assert index_problems(dataset, deep=True) == []
    assert verify(str(dataset), deep=True) == []
    done = run_cli("verify", dataset, "--deep")
    assert done.returncode == 0, done.stderr


def test_changed_index_file_differs_from_the_manifest(copy):
    path = copy / "train.index.avro"
    path.write_bytes(path.read_bytes() + b"\0")
    size = path.stat().st_size
    assert index_problems(copy) == [f"train.index.avro: size {size} bytes, manifest says {size - 1}"]  # unread
    path.write_bytes(path.read_bytes()[:-2] + b"\0")  # the stated size again, other bytes
    problems = index_problems(copy)
    assert any("train.index.avro: crc32c" in p for p in problems)
    assert any("sha256 differs" in p for p in problems)
    done = run_cli("verify", copy)
    assert done.returncode == 1 and "train.index.avro" in done.stderr and "Traceback" not in done.stderr


def test_missing_index_is_named(copy):
    (copy / "train.index.avro").unlink()
    assert index_problems(copy) == ["train.index.avro: missing"]


def test_row_that_frames_no_record_is_named(copy):
    # Rows 1 and 2 trade 5 bytes: still contiguous and inside the shard, but neither frames a record.
    def shift(rows):
        rows[1] = moved(rows[1], length=rows[1].length + 5)
        rows[2] = moved(rows[2], offset=rows[2].offset + 5, length=rows[2].length - 5)
        return rows

    rewrite_index(copy, "train", shift)
    problems = index_problems(copy)
    assert any(p.startswith("train.index.avro: row 1: no record at train-00000-of-00002.tfrecord") for p in problems)
    assert any(p.startswith("train.index.avro: row 2: no record") and "length checksum" in p for p in problems)


def test_rows_outside_their_shard_or_insane_are_reported_unread(copy):
    def hostile(rows):
        rows[0] = moved(rows[0], length=1 << 40)
        rows[3] = moved(rows[3], shard=7)
        return rows

    rewrite_index(copy, "train", hostile)
    problems = index_problems(copy)
    assert any("row 0: length 1099511627776 exceeds" in p for p in problems)
    assert any("row 3: shard 7 is not one of the split's 2 shards" in p for p in problems)


def test_rows_out_of_order_missing_or_not_ending_at_the_shard_end(copy):
    m = manifest_mod.load(str(copy))
    first = m.split("train").shards[0]
    rewrite_index(copy, "train", lambda rows: rows[first.num_records:] + rows[:first.num_records - 1])
    problems = index_problems(copy)
    assert any("rows are not in shard order" in p for p in problems)
    assert any(f"rows for {first.path}, manifest says {first.num_records}" in p for p in problems)


def test_last_row_must_end_at_the_shard_size(copy):
    rewrite_index(copy, "train", lambda rows: rows[:-1] + [rows[-1]])  # unchanged rows: clean
    assert index_problems(copy) == []
    m = manifest_mod.load(str(copy))
    second = m.split("train").shards[1]
    rewrite_index(copy, "train", lambda rows: rows[:-1])
    problems = index_problems(copy)
    assert any(f"the rows of {second.path} end at byte" in p for p in problems)
    assert any(f"{second.num_records - 1} rows for {second.path}" in p for p in problems)


def test_plain_compares_ids_and_labels_and_deep_every_field_with_the_record(copy):
    rewrite_index(copy, "train", lambda rows: [moved(r, source_id="elsewhere.jpg", label=r.label + 1)
                                               if i == 4 else r for i, r in enumerate(rows)])
    # framing holds; plain verify compares what tools take from rows (source id, labels), --deep every field
    assert index_problems(copy) == ["train.index.avro: row 4: train-00000-of-00002.tfrecord record 4: its index row "
                                    "gives source id 'elsewhere.jpg', the record 'a/img0006.jpg'"]
    problems = index_problems(copy, deep=True)
    assert any(p.startswith("train.index.avro: row 4: source_id is 'elsewhere.jpg', the record has") for p in problems)
    assert any("row 4: label is" in p for p in problems)


def test_many_bad_rows_are_capped(copy):
    rewrite_index(copy, "train", lambda rows: [moved(r, offset=r.offset + 1) for r in rows])
    problems = index_problems(copy)
    assert len(problems) == MAX_INDEX_PROBLEMS + 1 and problems[-1].startswith("train.index.avro: ... and ")


def test_dataset_without_index_has_nothing_to_check(copy):
    raw = json.loads((copy / "manifest.json").read_text())
    for split in raw["splits"].values():
        del split["index"]
    (copy / "manifest.json").write_text(json.dumps(raw))
    (copy / "croissant.json").unlink()  # it lists the indexes the manifest no longer names
    assert index_problems(copy) == [] and verify(str(copy)) == []
