"""Split expressions (TFDS's grammar): which rows each form selects, the same rows as TFDS, one-line errors for
malformed ones, and a "did you mean" for a split the dataset lacks. Pure: no TensorFlow, no build."""
from __future__ import annotations

import pytest
from synthetic import record, write_dataset

from shard_utils.format import schema
from shard_utils.format.manifest import ManifestError
from shard_utils.format.splits import resolve

COUNTS = {"train": [8] * 7 + [7], "validation": [3, 2], "fold0": [4, 4], "fold1": [4, 3], "fold2": [3, 3]}


def rows(selection) -> list[tuple[str, int]]:
    """(split, row) of every record a selection reads, in reading order (rows: the split's shard order)."""
    out = []
    for piece in selection.pieces:
        first = sum(COUNTS[piece.split][:piece.shard])
        out += [(piece.split, first + r) for r in range(piece.start, piece.stop)]
    return out


def split_rows(name: str, lo: int = 0, hi: int | None = None) -> list[tuple[str, int]]:
    return [(name, r) for r in range(sum(COUNTS[name]))][lo:hi]


@pytest.mark.parametrize("expression,expected", [
    ("train", split_rows("train")),
    ("train+validation", split_rows("train") + split_rows("validation")),
    (" train + validation ", split_rows("train") + split_rows("validation")),
    (["fold0", "fold1", "fold2"], split_rows("fold0") + split_rows("fold1") + split_rows("fold2")),
    ("fold0+fold1+fold2", split_rows("fold0") + split_rows("fold1") + split_rows("fold2")),
    ("train[:80%]", split_rows("train", 0, 50)),  # 0.8 x 63 = 50.4: the nearest record
    ("train[80%:]", split_rows("train", 50)),
    ("validation[25%:75%]", split_rows("validation", 1, 4)),  # 1.25 -> 1, 3.75 -> 4
    ("train[:12.5%]", split_rows("train", 0, 8)),  # 7.875 -> 8
    ("train[10:20]", split_rows("train", 10, 20)),
    ("train[-3:]", split_rows("train", 60)),
    ("train[:-60]", split_rows("train", 0, 3)),
    ("train[1shard]", split_rows("train", 8, 16)),
    ("train[-1shard]", split_rows("train", 56)),
    ("train[:2shard]+validation[1shard]", split_rows("train", 0, 16) + split_rows("validation", 3)),
    ("all", [r for name in COUNTS for r in split_rows(name)]),
])
def test_each_form_selects_its_rows_in_order(expression, expected):
    selection = resolve(expression, COUNTS)
    assert rows(selection) == expected
    assert selection.num_records == len(expected)


def test_a_slice_cuts_shards_at_records_and_keeps_whole_shards_whole():
    selection = resolve("train[5:20]", COUNTS)
    assert [(p.shard, p.start, p.stop) for p in selection.pieces] == [(0, 5, 8), (1, 0, 8), (2, 0, 4)]
    assert selection.whole == (False, True, False)
    # Adjacent slices of one split join back into whole shards.
    assert resolve("train[:20]+train[20:]", COUNTS).pieces == resolve("train", COUNTS).pieces


def test_the_same_rows_as_tfds():
    splits = pytest.importorskip("tensorflow_datasets.core.splits")
    infos = {name: splits.SplitInfo(name=name, shard_lengths=counts, num_bytes=0) for name, counts in COUNTS.items()}
    for spec in ["train[:80%]", "train[33%:67%]", "train[:12.5%]", "validation[25%:75%]", "train[-7%:]",
                 "train[10:20]+validation", "train[:-5]", "train[1shard]", "train[2shard:5shard]", "fold0+fold2[50%:]"]:
        expected = []
        for part in splits.ReadInstruction.from_spec(spec).to_absolute(infos):
            expected += split_rows(part.splitname, part.from_ or 0, part.to)
        assert rows(resolve(spec, COUNTS)) == expected, spec


@pytest.mark.parametrize("expression,message", [
    ("train[", r"term 'train\[' is not a split name with an optional \[from:to\] slice"),
    ("train+", "an empty term"),
    ("tr ain", "term 'tr ain' is not a split name"),
    ("train[1:2:3]", r"slice \[1:2:3\] of 'train' must be \[from:to\]"),
    ("train[a:]", "bound 'a' of 'train\\[a:\\]' is not an integer, a percentage"),
    ("train[3]", r"needs a slice \[from:to\]; only shards may be named alone"),
    ("train[1:50%]", r"mixes units \(%, records\)"),
    ("train[:150%]", "outside -100%..100%"),
    ("train[1.5shard]", "whole number of shards"),
    ("train[:64]", "reaches record 64; 'train' has 63 records"),
    ("train[8shard]", "names shard 8; 'train' has 8 shards"),
    ("train[5:5]", "selects no records"),
    ("train[:50%]+train[40%:]", r"'train\[40%:\]' and 'train\[:50%\]' overlap \(records 25..31 of 'train'\)"),
    ("validation+validation", "overlap"),
    ("all[:10%]", "takes no slice"),
    ([], "non-empty list"),
    (42, "a split name, an expression"),
])
def test_a_malformed_expression_is_one_line_naming_what_is_wrong(expression, message):
    with pytest.raises(ValueError, match=message) as info:
        resolve(expression, COUNTS)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A small dataset of splits train (8 records, 2 shards) and valid (4, 2 shards)."""
    labels = ["a", "b"]
    items = {"train": [record(i, (i % 2,), labels) for i in range(8)],
             "valid": [record(10 + i, (i % 2,), labels) for i in range(4)]}
    return write_dataset(tmp_path_factory.mktemp("splits"), items, labels, schema.feature_table(),
                         image_size=[12, 16])


@pytest.mark.parametrize("asked,hint", [
    ("validation", "did you mean 'valid'?"),  # an alias
    ("val", "did you mean 'valid'?"),
    ("trian", "did you mean 'train'?"),  # a typo
    ("test", ""),
])
def test_a_split_the_dataset_lacks_names_the_closest(dataset, asked, hint):
    with pytest.raises(ManifestError) as info:
        dataset.num_records(asked + "+train")
    assert str(info.value) == f"split {asked!r} is not in this dataset; {hint + ' ' if hint else ''}it has train, valid"


def test_the_manifest_counts_and_lists_expressions(dataset):
    assert dataset.num_records("train") == 8 and dataset.num_records(["train", "valid"]) == 12
    assert dataset.num_records("train[:25%]+valid[-1:]") == 3
    assert dataset.shard_paths("valid+train[1shard]") == dataset.shard_paths("valid") + dataset.shard_paths("train")[1:]
    with pytest.raises(ValueError, match=r"'train\[:3\]' cuts shard 0 of 'train' \(takes its records 0..2\)"):
        dataset.shard_paths("train[:3]")
    with pytest.raises(ManifestError, match=r"'train\[:3\]' is a split expression; this takes one split's name"):
        dataset.split("train[:3]")
