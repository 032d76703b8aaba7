"""Listing rows and walked files into media items: options, columns, paths, labels, extras, duplicates (no Beam)."""
from __future__ import annotations

import argparse

import pytest

from shard_utils.format.schema import ExtraSpec
from shard_utils.inputs import MediaItem
from shard_utils.inputs.listings import (
    ListingOptions,
    ListingRow,
    Rejection,
    add_arguments,
    check_columns,
    choose_path_column,
    extra_values,
    format_of,
    item_from_row,
    item_from_walk,
    label_from_name,
    labels_of,
    listing_options_from,
    missing,
    parse_extra_columns,
    pick_first,
    resolve_path,
)

PETS = r"^(?P<label>.+)_\d+\.\w+$"


def options(*argv: str) -> ListingOptions:
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return listing_options_from(ap.parse_args(list(argv)))


def row(fields, line=2, listing="/data/train.csv", error=None) -> ListingRow:
    return ListingRow(listing, "line", (line, 0), fields, error)


def test_defaults_and_kaggle_options():
    assert options() == ListingOptions()
    o = options("--listing", "train.csv", "--path-column", "id", "--path-template", "train_images/{}.jpg",
                "--extra-columns", "age:int64, bbox:float[] ,note", "--label-separator", " ")
    assert o.listings == ("train.csv",) and o.path_column == "id" and o.label_column == "label"
    assert o.extras == (ExtraSpec("age", "int64"), ExtraSpec("bbox", "float32", True), ExtraSpec("note", "string"))
    assert o.multi_label and o.extra_separator == " "
    assert options("--label-from-name", PETS).label_column is None  # labels from names; works without a listing


@pytest.mark.parametrize("argv, message", [
    (["--path-column", "id"], "--path-column needs --listing"),
    (["--extra-columns", "a"], "--extra-columns needs --listing"),
    (["--label-from-name", "(unclosed"], "--label-from-name '(unclosed' is not a valid regular expression"),
    (["--label-from-name", r"^(.+)_\d+"], r"--label-from-name '^(.+)_\d+' has no named group (?P<label>...)"),
    (["--label-from-name", r"(?P<label>\w+"], r"--label-from-name '(?P<label>\w+' is not a valid regular"),
    (["--listing", "a.csv", "--label-from-name", PETS, "--label-column", "y"], "not both"),
    (["--listing", "a.csv", "--path-template", "img/x.jpg"], "must contain '{}' exactly once"),
    (["--listing", "a.csv", "--path-template", "{}/{}.jpg"], "must contain '{}' exactly once"),
    (["--listing", "a.txt"], "cannot tell its format"),
    (["--listing", "a.avro.gz"], "Avro file compresses its own blocks"),
    (["--listing", "a.csv", "--extra-columns", "age:int32"], "type 'int32' is not int64, float or string"),
    (["--listing", "a.csv", "--extra-columns", "a,a:int64"], "names 'a' twice"),
    (["--listing", "a.csv", "--extra-columns", "a/b"], "a column name may use"),
    (["--listing", "a.csv", "--extra-columns", " , "], "--extra-columns is empty"),
    (["--listing", "a.csv", "--label-separator", ""], "--label-separator is empty"),
    (["--listing", "a.csv", "--label-column", " "], "--label-column is empty"),
])
def test_bad_options_are_one_line_errors_naming_the_option(argv, message):
    with pytest.raises(ValueError) as err:
        options(*argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_formats_from_extension_or_forced():
    assert [format_of(n) for n in ("a.csv", "gs://b/x/A.TSV", "a.jsonl", "a.json", "a.ndjson", "a.avro",
                                   "a.csv.gz", "a.jsonl.bz2", "lists/*.csv")] == \
        ["csv", "tsv", "jsonl", "jsonl", "jsonl", "avro", "csv", "jsonl", "csv"]
    assert format_of("list.txt", "jsonl") == "jsonl"


def test_extra_column_syntax():
    assert parse_extra_columns("tags[],w:float32,n:int,s:str,x:FLOAT[]") == (
        ExtraSpec("tags", "string", True), ExtraSpec("w", "float32"), ExtraSpec("n", "int64"),
        ExtraSpec("s", "string"), ExtraSpec("x", "float32", True))
    assert parse_extra_columns("Patient Age:int64") == (ExtraSpec("Patient Age", "int64"),)


def test_path_column_is_chosen_in_order_and_said():
    o = ListingOptions(listings=("t.csv",))
    assert choose_path_column(["label", "filename", "image"], o, "t.csv") == (
        "image", "listing t.csv: paths from column 'image' (set --path-column to choose another)")
    assert choose_path_column(["id", "label"], o, "t.csv")[0] == "id"
    assert choose_path_column(["id", "file"], ListingOptions(path_column="file"), "t.csv") == ("file", None)
    with pytest.raises(ValueError, match=r"has none of the columns path, image, uri, filename, id; .*'file', 'y'"):
        choose_path_column(["file", "y"], o, "t.csv")
    with pytest.raises(ValueError, match=r"no column 'p' \(--path-column\)"):
        choose_path_column(["id"], ListingOptions(path_column="p"), "t.csv")


def test_named_columns_must_be_in_the_header():
    o = ListingOptions(path_column="id", split_column="fold", extras=(ExtraSpec("age", "int64"),))
    check_columns(["id", "label", "fold", "age"], o, "t.csv")
    with pytest.raises(ValueError, match=r"no column 'label' \(--label-column or take labels from file names"):
        check_columns(["id", "fold", "age"], o, "t.csv")
    with pytest.raises(ValueError, match=r"no column 'age' \(--extra-columns\)"):
        check_columns(["id", "label", "fold"], o, "t.csv")


@pytest.mark.parametrize("options, option", [
    (ListingOptions(listings=("t.csv",), label_column="id"), "--label-column"),  # the path column chosen: id
    (ListingOptions(path_column="label"), "--label-column"),  # the label column by default: label
    (ListingOptions(path_column="id", split_column="id"), "--split-column"),
])
def test_the_path_column_is_never_also_the_label_or_split_column(options, option):
    """Once built silently: a label per file (its id), or every row refused as a duplicate of its label's path."""
    with pytest.raises(ValueError, match=rf"column '(id|label)' holds the paths and cannot also be the {option}"):
        (choose_path_column if options.path_column is None else check_columns)(["id", "label"], options, "t.csv")


@pytest.mark.parametrize("value, root, expected", [
    ("cat/1.jpg", "/in", ("cat/1.jpg", "/in/cat/1.jpg")),
    ("./cat//1.jpg", "/in", ("cat/1.jpg", "/in/cat/1.jpg")),
    ("  cat/1.jpg ", "/in", ("cat/1.jpg", "/in/cat/1.jpg")),
    ("cat/1.jpg", "gs://bkt/pre/", ("cat/1.jpg", "gs://bkt/pre/cat/1.jpg")),
    ("./cat/1.jpg", "gs://bkt/pre", ("cat/1.jpg", "gs://bkt/pre/cat/1.jpg")),
    ("gs://other-bucket/x/1.jpg", "/in", ("gs://other-bucket/x/1.jpg", "gs://other-bucket/x/1.jpg")),
    ("/elsewhere/./a/../b.png", "/in", ("/elsewhere/b.png", "/elsewhere/b.png")),  # the user's own path
    ("/abs.jpg", None, ("/abs.jpg", "/abs.jpg")),
])
def test_paths_resolve(value, root, expected):
    assert resolve_path(value, root) == expected


@pytest.mark.parametrize("value, message", [
    ("", "empty path"),
    ("../secret.jpg", "climbs out of --input"),
    ("a/../../b.jpg", "climbs out of --input"),
    ("cat\\1.jpg", "write paths with '/'"),
    ("https://example.com/a.jpg", "only gs:// URIs and local paths"),
    ("s3://b/a.jpg", "only gs:// URIs and local paths"),
    ("file:///tmp/a.jpg", "only gs:// URIs and local paths"),
    ("gs://bucket-only", "must name an object"),
    ("gs://b/folder/", "must name an object"),
    ("gs://b//x.jpg", "has an empty, '.' or '..' part"),
    ("gs://b/a/../x.jpg", "has an empty, '.' or '..' part"),
    ("gs://b/./x.jpg", "has an empty, '.' or '..' part"),
    ("C:/data/a.jpg", "Windows path"),
    ("cat/", "names a folder"),
    ("a\nb.jpg", "line break"),
])
def test_bad_paths_say_why(value, message):
    with pytest.raises(ValueError, match=message):
        resolve_path(value, "/in")
    with pytest.raises(ValueError, match="no --input"):
        resolve_path("cat/1.jpg", None)


@pytest.mark.parametrize("value", ["cat//1.jpg", ".//cat/1.jpg", "cat/x//1.jpg"])
def test_a_doubled_slash_under_a_bucket_is_refused_not_dropped(value):
    """gs://bkt/pre/cat//1.jpg is another object than gs://bkt/pre/cat/1.jpg: reading the second for the first would
    be another image under its id. Locally the two are one file (test_paths_resolve)."""
    with pytest.raises(ValueError, match=r"has an empty part \('//'\): on gs:// it names another object than"):
        resolve_path(value, "gs://bkt/pre")


def test_kaggle_row_with_template_split_and_typed_extras():
    o = options("--listing", "train.csv", "--path-column", "id", "--path-template", "train_images/{}.jpg",
                "--split-column", "fold", "--extra-columns", "age:int64,w:float,tags:string[],bbox:float[]")
    fields = {"id": "abc", "label": " cat ", "fold": "validation", "age": "7", "w": "0.5", "tags": "a  b",
              "bbox": "[1, 2.5, 3, 4]"}
    item = item_from_row(row(fields, line=18), o, "gs://bkt/comp")
    assert item == MediaItem(source_id="train_images/abc.jpg", uri="gs://bkt/comp/train_images/abc.jpg", size=0,
                             labels=("cat",), split="validation",
                             extras=(("age", (7,)), ("w", (0.5,)), ("tags", ("a", "b")),
                                     ("bbox", (1.0, 2.5, 3.0, 4.0))),
                             origin="train.csv line 18")
    assert isinstance(item.extras[0][1][0], int) and isinstance(item.extras[3][1][0], float)


def test_jsonl_and_avro_values_lists_and_numbers():
    o = ListingOptions(listings=("a.jsonl",), path_column="id", path_template="img/{}.png",
                       extras=(ExtraSpec("n", "int64"), ExtraSpec("xs", "float32", True), ExtraSpec("s", "string"),
                               ExtraSpec("empty", "int64", True)))
    r = ListingRow("gs://b/a.jsonl", "byte", (5120, 0), {"id": 42, "label": ["dog", "cat", "dog"], "n": 3,
                                                          "xs": [1, 2.5], "s": 12, "empty": None})
    item = item_from_row(r, o, "/in")
    assert (item.source_id, item.labels, item.extras, item.origin) == (
        "img/42.png", ("dog", "cat"), (("n", (3,)), ("xs", (1.0, 2.5)), ("s", ("12",)), ("empty", ())),
        "a.jsonl byte 5120")
    assert ListingRow("/x/b.avro", "block", (4096, 3), {}).origin == "b.avro block 4096 record 3"


def test_multi_label_separators():
    assert labels_of("haze primary  clear", " ") == ("haze", "primary", "clear")
    assert labels_of("a|b| a |", "|") == ("a", "b")
    assert labels_of("a b", None) == ("a b",)
    assert labels_of(7, None) == ("7",)
    for empty in ("", "  ", None, [], ["", " "]):
        assert labels_of(empty, " ") == ()


@pytest.mark.parametrize("label", ["", "  ", None, []])
def test_a_row_without_a_label_is_an_unlabeled_item_that_says_what_it_becomes_in_a_labeled_build(label):
    out = item_from_row(row({"path": "a.jpg", "label": label}, line=17), ListingOptions(path_column="path"), "/in")
    assert isinstance(out, MediaItem) and out.labels == () and out.label == ""
    assert out.no_label == ("bad_row", "empty label in column 'label'") and out.origin == "train.csv line 17"


@pytest.mark.parametrize("fields, message", [
    ({"label": "cat"}, "train.csv line 17: no column 'path'"),
    ({"path": "a.jpg"}, "train.csv line 17: no column 'label'"),
    ({"path": "a.jpg", "label": "cat", "age": "seven"}, "column 'age': 'seven' is not an integer (int64)"),
    ({"path": "a.jpg", "label": "cat", "age": "3.0"}, "is not an integer"),
    ({"path": "a.jpg", "label": "cat", "age": str(1 << 63)}, "does not fit in int64"),
    ({"path": "a.jpg", "label": "cat", "age": "1", "w": "nan"}, "is not a finite float32"),
    ({"path": "a.jpg", "label": "cat", "age": "1", "w": "1e39"}, "is not a finite float32"),
    ({"path": "a.jpg", "label": "cat", "age": "1", "w": ""}, "is not a number (float)"),
    ({"path": "a.jpg", "label": "cat", "age": [1, 2], "w": "1"}, "holds a list; declare it as age:int64[]"),
    ({"path": "a.jpg", "label": "cat", "age": True, "w": "1"}, "'True' is not a number"),
    ({"path": "a.jpg", "label": "cat", "age": None, "w": "1"}, "column 'age' has no value"),
    ({"path": "a.jpg", "label": "cat", "age": "1", "w": "1", "split": "my split"}, "may use only ASCII letters"),
    ({"path": "a.jpg", "label": "cat", "age": "1", "w": "1", "split": ""}, "empty split"),
    ({"path": ["a.jpg"], "label": "cat"}, "column 'path' is '[\"a.jpg\"]', not text"),
    ({"path": "https://x/a.jpg", "label": "cat"}, "only gs:// URIs and local paths"),
])
def test_malformed_rows_are_bad_row_with_origin(fields, message):
    o = ListingOptions(path_column="path", split_column="split" if "split" in fields else None,
                       extras=(ExtraSpec("age", "int64"), ExtraSpec("w", "float32")) if "age" in fields else ())
    out = item_from_row(row(fields, line=17), o, "/in")
    assert isinstance(out, Rejection) and out.reason == "bad_row", out
    assert message in out.message and out.message.startswith("train.csv line 17: ")


def test_unparsed_row_is_bad_row():
    out = item_from_row(row(None, line=9, error="has 3 fields, the header 2"), ListingOptions(path_column="p"), "/in")
    assert out == Rejection("train.csv line 9", "bad_row", "train.csv line 9: has 3 fields, the header 2")


def test_label_from_name_for_listings_and_walks():
    o = options("--listing", "list.csv", "--path-column", "path", "--label-from-name", PETS)
    item = item_from_row(row({"path": "images/great_pyrenees_173.jpg"}), o, "/pets")
    assert item.labels == ("great_pyrenees",) and item.uri == "/pets/images/great_pyrenees_173.jpg"
    walked = item_from_walk("images/Abyssinian_1.jpg", 1234, "/pets", False, options("--label-from-name", PETS))
    assert walked == MediaItem("images/Abyssinian_1.jpg", "/pets/images/Abyssinian_1.jpg", 1234, ("Abyssinian",))
    top = item_from_walk("Bengal_20.png", 5, "gs://b/p", False, options("--label-from-name", PETS))
    assert top.labels == ("Bengal",) and top.uri == "gs://b/p/Bengal_20.png"
    for out in (item_from_row(row({"path": "images/readme.jpg"}), o, "/pets"),
                item_from_walk("x/readme.jpg", 1, "/pets", False, options("--label-from-name", PETS))):
        assert isinstance(out, Rejection) and out.reason == "no_label"
        assert f"'readme.jpg' does not match --label-from-name '{PETS}'" in out.message
    assert label_from_name("a_1.jpg", r"(?P<label>x)?_1") is None  # an empty label group is no label


def test_walk_keeps_folder_labels_and_split_folders():
    o = ListingOptions()
    assert item_from_walk("train/cat/a.jpg", 10, "/in", True, o) == MediaItem(
        "train/cat/a.jpg", "/in/train/cat/a.jpg", 10, ("cat",), "train")
    out = item_from_walk("a.jpg", 10, "/in", False, o)
    assert out == MediaItem("a.jpg", "/in/a.jpg", 10, (), no_label=(
        "no_label", "file sits directly in the input folder, not in a label folder"))


def test_extra_lists_in_csv_cells():
    tags = ExtraSpec("tags", "string", True)
    assert extra_values(tags, "a;b c;", ";") == ("a", "b c", "")
    assert extra_values(tags, "", ";") == ()
    assert extra_values(ExtraSpec("xy", "int64", True), " 1  2\t3 ") == (1, 2, 3)
    assert extra_values(ExtraSpec("xy", "int64", True), 5) == (5,)
    with pytest.raises(ValueError, match="is not a JSON array"):
        extra_values(ExtraSpec("xy", "int64", True), "[1, 2,]")
    assert extra_values(ExtraSpec("b", "string"), b"caf\xc3\xa9") == ("café",)


def test_first_of_duplicates_is_kept_by_listing_then_position():
    def listed(listing, line):
        r = ListingRow(listing, "line", (line, 0), {"path": "a.jpg", "label": "cat"})
        return r.order, item_from_row(r, ListingOptions(path_column="path"), "/in")

    rows = [listed("/l/b.csv", 2), listed("/l/a.csv", 30), listed("/l/a.csv", 4)]
    kept, rejected = pick_first(rows)
    assert kept.origin == "a.csv line 4"
    assert [r.as_dict() for r in rejected] == [
        {"source": "a.jpg", "reason": "duplicate_row", "message": "a.csv line 30: /in/a.jpg is listed again; "
                                                                  "the row at a.csv line 4 is kept"},
        {"source": "a.jpg", "reason": "duplicate_row", "message": "b.csv line 2: /in/a.jpg is listed again; "
                                                                  "the row at a.csv line 4 is kept"}]
    assert pick_first(list(reversed(rows)))[0] == kept  # the same whatever order they arrive in


def test_missing_message():
    item = MediaItem("x/1.jpg", "gs://b/x/1.jpg", 0, ("cat",), origin="train.csv line 5")
    assert missing(item) == Rejection("x/1.jpg", "missing", "train.csv line 5: gs://b/x/1.jpg does not exist")
