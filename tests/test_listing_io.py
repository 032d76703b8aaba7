"""Listings read as Beam sources on the in-process runner: CSV/TSV, JSONL (split), Avro (split), gzip, gs://."""
from __future__ import annotations

import gzip
import io
import json
import pickle
from pathlib import Path

import apache_beam as beam
import fastavro
import pytest
from apache_beam.io import source_test_utils
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_jobs.pipeline.listing_sources import (
    DropDuplicateRows,
    ListingItems,
    ListingSource,
    ReadListings,
    listing_columns,
    match_listings,
    prepare_listings,
)
from shard_utils import storage
from shard_utils.format.schema import ExtraSpec
from shard_utils.inputs.listing_files import ListingError, json_row, read_rows
from shard_utils.inputs.listings import ListingOptions, ListingRow, item_from_row


def run(build, out: Path):
    """Run build(pipeline) -> {name: pcollection} on the in-process runner; returns {name: sorted elements}."""
    with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([])) as p:
        for name, pcoll in build(p).items():
            _ = (pcoll | f"List{name}" >> beam.combiners.ToList()
                 | f"Save{name}" >> beam.Map(lambda xs, n=name: (out / f"{n}.pkl").write_bytes(pickle.dumps(xs))))
    return {path.stem: sorted(pickle.loads(path.read_bytes()), key=repr) for path in out.glob("*.pkl")}


def read_all(source) -> list[ListingRow]:
    return source_test_utils.read_from_source(source, None, None)


CSV = ("\ufeffpath, label ,caption\r\n"
       "cat/1.jpg,cat,plain\r\n"
       "\r\n"
       "cat/2.jpg,cat,\"two\nlines, and a comma\"\r\n"
       "dog/1.jpg,dog\r\n"
       "dog/2.jpg,dog,\"say \"\"woof\"\"\"\r\n")


def test_csv_streams_rows_with_exact_line_numbers(tmp_path):
    listing = tmp_path / "train.csv"
    listing.write_bytes(CSV.encode() + b"dog/\xff.jpg,dog,x\r\nfish/1.jpg,fish,\"last\nrow\"")
    rows = read_all(ListingSource(str(listing), "csv"))
    assert [(r.origin, r.fields, r.error) for r in rows] == [
        ("train.csv line 2", {"path": "cat/1.jpg", "label": "cat", "caption": "plain"}, None),
        ("train.csv line 4", {"path": "cat/2.jpg", "label": "cat", "caption": "two\nlines, and a comma"}, None),
        ("train.csv line 6", None, "has 2 fields, the header 3"),
        ("train.csv line 7", {"path": "dog/2.jpg", "label": "dog", "caption": 'say "woof"'}, None),
        ("train.csv line 8", {"path": "dog/\udcff.jpg", "label": "dog", "caption": "x"}, None),  # see listings._text
        ("train.csv line 9", {"path": "fish/1.jpg", "label": "fish", "caption": "last\nrow"}, None)]
    assert ListingSource(str(listing), "csv").splittable is False  # a quoted line break rules out splitting


@pytest.mark.parametrize("tail, says", [
    ('bird/1.jpg,bird,"unclosed\nfish/1.jpg,fish,x\nfish/2.jpg,fish,y\n', "line 9: a quoted field is never closed"),
    ("fish/1.jpg,fish," + "x" * (128 * 1024 + 1) + "\nfish/2.jpg,fish,y\n",
     "line 9: not readable as CSV (field larger than field limit (131072))"),
    ('bird/1.jpg,bird,"unclosed\nfish/1.jpg,"fish",x\nfish/2.jpg,fish,y\n',
     "lines 9..10: a quoted field runs over 2 lines and leaves a row of 4 fields"),
])
def test_a_csv_listing_that_cannot_be_read_to_its_end_is_an_error_naming_the_line(tmp_path, tail, says):
    """Rows after an unclosed quote or an oversized field would otherwise vanish (swallowed or never read)."""
    listing = tmp_path / "train.csv"
    listing.write_bytes(CSV.encode() + b"dog/3.jpg,dog,x\n" + tail.encode())
    with open(listing, "rb") as f, pytest.raises(ListingError) as err:
        list(read_rows(f, str(listing), "csv"))  # as a local build's worker reads it
    assert str(err.value).startswith(f"listing {listing} {says}") and "\n" not in str(err.value)
    with pytest.raises(ListingError) as err:
        read_all(ListingSource(str(listing), "csv"))  # as Beam reads it
    assert str(err.value).startswith(f"listing {listing} {says}")


def test_a_jsonl_line_nested_too_deeply_is_a_bad_row(tmp_path):
    deep = b"[" * 2000 + b"]" * 2000 + b"\n"
    row = json_row("a.jsonl", 17, deep)
    assert row.fields is None and row.error == "is not JSON this reader can take (nested too deeply)"
    assert json_row("a.jsonl", 0, b'{"path": "a.jpg"}\n').fields == {"path": "a.jpg"}


@pytest.mark.parametrize("damage", ["truncated", "corrupt block"])
def test_a_damaged_avro_listing_is_an_error_naming_the_block(tmp_path, damage):
    listing = tmp_path / "rows.avro"
    with listing.open("wb") as f:
        fastavro.writer(f, AVRO_SCHEMA, avro_rows(400), sync_interval=300)
    data = listing.read_bytes()
    listing.write_bytes(data[:len(data) // 2] if damage == "truncated" else data[:-40] + b"\xff" * 24 + data[-16:])
    with pytest.raises(ListingError, match=f"listing {listing}: the Avro block at byte [0-9]+ is damaged"):
        read_all(ListingSource(str(listing), "avro"))


def test_tsv_and_gzip_csv(tmp_path):
    (tmp_path / "a.tsv").write_text("id\tlabel\nx 1\tcat\n")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(CSV.encode()))
    tsv = read_all(ListingSource(str(tmp_path / "a.tsv"), "tsv"))
    assert [r.fields for r in tsv] == [{"id": "x 1", "label": "cat"}]
    rows = read_all(ListingSource(str(tmp_path / "b.csv.gz"), "csv"))
    assert [r.position[0] for r in rows] == [2, 4, 6, 7]
    assert rows[1].fields["caption"] == "two\nlines, and a comma"


def jsonl_lines(n: int) -> list[bytes]:
    lines = []
    for i in range(n):
        if i % 17 == 5:
            lines.append(b"{not json\n")
        elif i % 23 == 7:
            lines.append(b"\n")
        else:
            lines.append(json.dumps({"path": f"c{i % 3}/{i:04d}.jpg", "label": [f"c{i % 3}", "x"] if i % 2 else
                                     f"c{i % 3}", "note": "é" * (i % 5)}).encode() + b"\n")
    return lines


def test_jsonl_splits_at_any_byte_and_reads_every_row_once(tmp_path):
    lines = jsonl_lines(300)
    listing = tmp_path / "rows.jsonl"
    data = b"".join(lines)
    listing.write_bytes(data)
    source = ListingSource(str(listing), "jsonl")
    whole = read_all(source)
    assert len(whole) == 300 - sum(1 for line in lines if line == b"\n")
    starts = {sum(map(len, lines[:i])): line for i, line in enumerate(lines)}
    for row in whole:  # the position is the byte offset where the row's line starts
        line = starts[row.position[0]]
        assert row.fields == json.loads(line) if row.fields else line.startswith(b"{not")
    bad = [r for r in whole if r.error]
    assert len(bad) == sum(1 for line in lines if line.startswith(b"{not")) and "is not JSON" in bad[0].error
    splits = [b.source for b in source.split(desired_bundle_size=997)]
    assert len(splits) > 5
    source_test_utils.assert_sources_equal_reference_source((source, None, None),
                                                            [(s, None, None) for s in splits])
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"".join(lines[:12]))
    source_test_utils.assert_split_at_fraction_exhaustive(ListingSource(str(small), "jsonl"))


def test_jsonl_gzip_and_bom(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + b"".join(jsonl_lines(40))))
    rows = read_all(ListingSource(str(tmp_path / "a.jsonl.gz"), "jsonl"))
    assert rows[0].fields["path"] == "c0/0000.jpg" and rows[0].position == (0, 0)
    assert len(rows) == sum(1 for line in jsonl_lines(40) if line != b"\n")  # blank lines are no rows


AVRO_SCHEMA = {"type": "record", "name": "Row", "fields": [
    {"name": "image", "type": "string"},
    {"name": "labels", "type": {"type": "array", "items": "string"}},
    {"name": "bbox", "type": ["null", {"type": "array", "items": "float"}]},
    {"name": "age", "type": ["null", "long"]}]}


def avro_rows(n: int) -> list[dict]:
    return [{"image": f"gs://pics/{i:04d}.jpg", "labels": ["a", "b"][: 1 + i % 2],
             "bbox": None if i % 3 == 0 else [0.5, float(i)], "age": None if i % 4 == 0 else i} for i in range(n)]


def test_avro_arrays_and_nullable_unions_split_at_blocks(tmp_path):
    listing = tmp_path / "rows.avro"
    with listing.open("wb") as f:
        fastavro.writer(f, AVRO_SCHEMA, avro_rows(400), sync_interval=300)
    source = ListingSource(str(listing), "avro")
    whole = read_all(source)
    assert [r.fields for r in whole] == avro_rows(400)
    assert len({r.position[0] for r in whole}) > 10 and whole[1].origin.startswith("rows.avro block ")
    splits = [b.source for b in source.split(desired_bundle_size=1000)]
    assert len(splits) > 5
    source_test_utils.assert_sources_equal_reference_source((source, None, None), [(s, None, None) for s in splits])
    small = tmp_path / "small.avro"
    with small.open("wb") as f:
        fastavro.writer(f, AVRO_SCHEMA, avro_rows(12), sync_interval=100)
    source_test_utils.assert_split_at_fraction_exhaustive(ListingSource(str(small), "avro"))
    o = ListingOptions(listings=(str(listing),), path_column="image", label_column="labels",
                       extras=(ExtraSpec("bbox", "float32", True),))
    items = [item_from_row(r, o, None) for r in whole[:4]]
    assert [(i.uri, i.labels, i.extras) for i in items] == [
        ("gs://pics/0000.jpg", ("a",), (("bbox", ()),)),
        ("gs://pics/0001.jpg", ("a", "b"), (("bbox", (0.5, 1.0)),)),
        ("gs://pics/0002.jpg", ("a",), (("bbox", (0.5, 2.0)),)),
        ("gs://pics/0003.jpg", ("a", "b"), (("bbox", ()),))]


def test_listing_items_and_duplicates_on_the_in_process_runner(tmp_path):
    (tmp_path / "a.csv").write_text("image,label,split\ncat/1.jpg,cat,train\n./cat/1.jpg,cat,test\n"
                                    "dog/1.jpg,,train\ndog/2.jpg,dog,validation\n")
    (tmp_path / "b.jsonl").write_text('{"image": "cat/1.jpg", "label": "cat", "split": "train"}\n'
                                      '{"image": "/abs/x.jpg", "label": ["x", "y"], "split": "test"}\n')
    options, notes = prepare_listings(ListingOptions(listings=(str(tmp_path / "a.csv"), str(tmp_path / "b.jsonl")),
                                                     split_column="split"))
    assert options.path_column == "image" and notes == [
        f"listing {tmp_path / 'a.csv'}: paths from column 'image' (set --path-column to choose another)"]

    def build(p):
        listed = p | ListingItems(options, "/in")
        unique = listed.items | DropDuplicateRows()
        return {"items": unique.items, "rejected": (listed.rejected, unique.rejected) | beam.Flatten()}

    out = run(build, tmp_path)
    assert [(i.source_id, i.uri, i.labels, i.split, i.origin) for i in sorted(out["items"], key=lambda i: i.uri)] == [
        ("/abs/x.jpg", "/abs/x.jpg", ("x", "y"), "test", "b.jsonl byte 57"),
        ("cat/1.jpg", "/in/cat/1.jpg", ("cat",), "train", "a.csv line 2"),
        ("dog/1.jpg", "/in/dog/1.jpg", (), "train", "a.csv line 4"),  # unlabeled: encoding decides (rejected here)
        ("dog/2.jpg", "/in/dog/2.jpg", ("dog",), "validation", "a.csv line 5")]
    assert sorted(out["rejected"], key=lambda r: r["message"]) == [
        {"source": "cat/1.jpg", "reason": "duplicate_row",
         "message": "a.csv line 3: /in/cat/1.jpg is listed again; the row at a.csv line 2 is kept"},
        {"source": "cat/1.jpg", "reason": "duplicate_row",
         "message": "b.jsonl byte 0: /in/cat/1.jpg is listed again; the row at a.csv line 2 is kept"}]


def test_launch_checks_are_one_line_errors(tmp_path):
    (tmp_path / "a.csv").write_text("id,label\n1,cat\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "nolabel.csv").write_text("path,kind\n")
    (tmp_path / "none.jsonl").write_text("\n")
    (tmp_path / "bad.avro").write_bytes(b"not avro at all")
    (tmp_path / "dup.csv").write_text("path,label,path\n")
    cases = [
        ((str(tmp_path / "zzz*.csv"),), "matches no file"),
        ((str(tmp_path / "a.csv"), str(tmp_path / "*.csv")), "its rows would be read twice"),
        ((str(tmp_path / "empty.csv"),), "is empty: a CSV listing starts with a header row"),
        ((str(tmp_path / "nolabel.csv"),), "has no column 'label' (--label-column or take labels from file names"),
        ((str(tmp_path / "none.jsonl"),), "has no rows to find the path column in; give --path-column"),
        ((str(tmp_path / "bad.avro"),), "is not an Avro file"),
        ((str(tmp_path / "dup.csv"),), "the header names column 'path' twice"),
    ]
    for listings_, message in cases:
        with pytest.raises(ValueError) as err:
            prepare_listings(ListingOptions(listings=listings_))
        assert message in str(err.value) and "\n" not in str(err.value), (listings_, err.value)
    assert prepare_listings(ListingOptions(listings=(str(tmp_path / "a.csv"),)))[0].path_column == "id"
    assert listing_columns(str(tmp_path / "none.jsonl"), "jsonl") is None


def test_listing_in_one_bucket_naming_images_in_two_others(gcs, tmp_path):
    lists, pics, other = gcs.new_bucket("lists"), gcs.new_bucket("pics"), gcs.new_bucket("other")
    for bucket, name, data in [(pics, "data/cat/1.jpg", b"cat1"), (pics, "data/dog/1.jpg", b"dog1"),
                               (other, "x/fish.jpg", b"fish")]:
        gcs.client.bucket(bucket).blob(name).upload_from_string(data)
    gcs.client.bucket(lists).blob("l/part-0.csv").upload_from_string(
        "path,label\ncat/1.jpg,cat\n" f"gs://{other}/x/fish.jpg,fish\n")
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "R", "fields": [
        {"name": "path", "type": "string"}, {"name": "label", "type": "string"}]},
        [{"path": "dog/1.jpg", "label": "dog"}, {"path": "dog/404.jpg", "label": "dog"}])
    gcs.client.bucket(lists).blob("l/part-1.avro").upload_from_string(buf.getvalue())
    patterns = (f"gs://{lists}/l/*.csv", f"gs://{lists}/l/part-1.avro")
    assert match_listings(patterns) == {patterns[0]: [f"gs://{lists}/l/part-0.csv"],
                                        patterns[1]: [f"gs://{lists}/l/part-1.avro"]}
    options, notes = prepare_listings(ListingOptions(listings=patterns))
    assert options.path_column == "path"

    def build(p):
        listed = p | ListingItems(options, f"gs://{pics}/data/")
        return {"items": (listed.items | DropDuplicateRows()).items, "rejected": listed.rejected,
                "rows": p | "Rows" >> ReadListings(patterns)}

    out = run(build, tmp_path)
    assert out["rejected"] == [] and len(out["rows"]) == 4
    items = {i.uri: i for i in out["items"]}
    assert sorted(items) == [f"gs://{other}/x/fish.jpg", f"gs://{pics}/data/cat/1.jpg",
                             f"gs://{pics}/data/dog/1.jpg", f"gs://{pics}/data/dog/404.jpg"]
    found = {uri: storage.read_bytes(uri) for uri in items if storage.exists(uri)}
    assert found == {f"gs://{other}/x/fish.jpg": b"fish", f"gs://{pics}/data/cat/1.jpg": b"cat1",
                     f"gs://{pics}/data/dog/1.jpg": b"dog1"}
    assert items[f"gs://{pics}/data/dog/404.jpg"].origin.startswith("part-1.avro block ")


@pytest.mark.slow
def test_the_build_stops_on_a_listing_it_cannot_read_to_its_end_and_rejects_a_too_deep_line(tmp_path):
    """Through the command line: one line and exit 1 for an unclosed quote or a truncated Avro listing, nothing
    published; a JSONL line nested 2,000 deep is a bad row like any line that is not JSON."""
    from conftest import run_cli, write_images

    write_images(tmp_path / "in", {"cat": 3}, size=(24, 16))
    (tmp_path / "open.csv").write_text('path,label\ncat/img0000.jpg,cat\n"cat/img0001.jpg,cat\ncat/img0002.jpg,cat\n')
    with (tmp_path / "cut.avro").open("wb") as f:
        fastavro.writer(f, {"type": "record", "name": "R", "fields": [{"name": "path", "type": "string"},
                                                                    {"name": "label", "type": "string"}]},
                        [{"path": f"cat/img{i:04d}.jpg", "label": "cat"} for i in range(3)] * 50, sync_interval=200)
    (tmp_path / "cut.avro").write_bytes((tmp_path / "cut.avro").read_bytes()[:-100])
    for name, says in (("open.csv", "line 3: a quoted field is never closed"),
                       ("cut.avro", "is damaged")):
        out = tmp_path / f"out-{name}"
        done = run_cli("build", "--listing", tmp_path / name, "--input", tmp_path / "in", "--output", out)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and says in lines[0] and str(tmp_path / name) in lines[0], \
            done.stderr[-2000:]
        assert not (out / "manifest.json").exists()
    (tmp_path / "deep.jsonl").write_text('{"path": "cat/img0000.jpg", "label": "cat"}\n' + "[" * 2000 + "]" * 2000
                                         + '\n{"path": "cat/img0001.jpg", "label": "cat"}\n')
    done = run_cli("build", "--listing", tmp_path / "deep.jsonl", "--input", tmp_path / "in", "--output",
                   tmp_path / "deep", "--num-cores", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    (rejected,) = [json.loads(line) for line in (tmp_path / "deep" / "rejected.jsonl").read_text().splitlines()]
    assert rejected["reason"] == "bad_row" and "nested too deeply" in rejected["message"]
