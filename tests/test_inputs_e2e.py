"""The input shapes people bring, through the whole job: a Kaggle-style train.csv, labels in file names,
a folder of symbolic links, and a JSONL listing in one bucket naming images in two others."""
from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
from conftest import photo, run_cli, run_job, write_images
from readers import by_source, rejected

from shard_utils.format import schema
from shard_utils.read.verify import verify


def flat_kaggle(root, n=24):
    """train_images/<id>.jpg and a train.csv of id, space-separated labels, age and a token list."""
    (root / "train_images").mkdir(parents=True)
    lines = ["id,labels,age,tokens"]
    for i in range(n):
        ident = f"{i:04x}ab"
        photo(40, 30, seed=i).save(root / "train_images" / f"{ident}.jpg", quality=90)
        labels = ["haze primary", "clear", "primary water", "clear primary"][i % 4]
        lines.append(f'{ident},{labels},{20 + i},"{" ".join(str(t) for t in range(i % 5 + 1))}"')
    lines.append("ffffff,clear,3,1")  # names a file that is not there
    lines.append("0000ab,clear,4,1")  # names the first file again
    lines.append("0001ab,clear,old,1")  # age is not an int64
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return root / "train.csv"


@pytest.mark.slow
def test_kaggle_train_csv_with_multi_labels_and_extra_columns(tmp_path):
    listing = flat_kaggle(tmp_path / "comp")
    out = tmp_path / "out"
    m = run_job(tmp_path / "comp", out, "--listing", listing, "--path-template", "train_images/{}.jpg",
                "--label-column", "labels", "--label-separator", " ", "--extra-columns", "age:int64,tokens:int64[]",
                "--num-cores", "2")
    assert rejected(out) == {"train_images/ffffff.jpg": "missing", "train_images/0000ab.jpg": "duplicate_row",
                             "train_images/0001ab.jpg": "bad_row"}
    entries = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    lines = {entry["reason"]: entry["message"] for entry in entries}
    assert "train.csv line" in lines["missing"] and "train.csv line" in lines["bad_row"]
    assert m.files_seen == 27 and m.splits["train"].num_records == 24  # rows, not files, are accounted
    assert m.multi_label and m.labels == ["clear", "haze", "primary", "water"]
    assert m.features["extra/tokens"] == {"dtype": "int64", "shape": [-1], "max_length": 5}
    assert m.features["extra/age"] == {"dtype": "int64", "shape": []}
    assert m.features[schema.LABEL]["max_length"] == 2
    rec = by_source(out)["train_images/0002ab.jpg"]
    assert rec[schema.LABEL] == [2, 3] and rec[schema.LABEL_TEXT] == [b"primary", b"water"]
    assert rec["extra/age"] == 22 and rec["extra/tokens"] == [0, 1, 2]
    assert verify(str(out), deep=True) == []

    import tensorflow as tf

    from shard_utils.read import loader

    batch = next(iter(loader.make_dataset(str(out), "train", 4, training=False, as_dict=True, image_size=32)))
    assert batch["label"].shape == (4, 4) and batch["label"].dtype == tf.float32
    assert batch["extra/tokens"].shape == (4, 5) and batch["extra/age"].shape == (4,)
    assert set(np.unique(batch["label"].numpy())) <= {0.0, 1.0}

    from shard_utils.read import report

    sample = report.sample_split(m, "train", seed=0)
    assert sample.num_records == 24 < sum(sample.class_counts.values())
    assert {t.source_id for tiles in sample.groups.values() for t in tiles if len(t.labels) == 2}


@pytest.mark.slow
def test_labels_from_file_names(tmp_path):
    src = tmp_path / "pets"
    src.mkdir()
    for i, breed in enumerate(["great_pyrenees", "abyssinian", "great_pyrenees", "shiba_inu"] * 3):
        photo(32, 24, seed=i).save(src / f"{breed}_{i}.jpg")
    photo(32, 24, seed=99).save(src / "README.jpg")
    out = tmp_path / "out"
    m = run_job(src, out, "--label-from-name", r"^(?P<label>.+)_\d+\.\w+$", "--num-cores", "2")
    assert m.labels == ["abyssinian", "great_pyrenees", "shiba_inu"]
    assert m.splits["train"].class_counts == {"abyssinian": 3, "great_pyrenees": 6, "shiba_inu": 3}
    assert rejected(out) == {"README.jpg": "no_label"}
    bad = run_cli("build", "--input", src, "--output", tmp_path / "o2", "--label-from-name", "(unclosed")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--label-from-name" in bad.stderr


@pytest.mark.slow
def test_a_folder_of_symbolic_links_builds_with_follow_symlinks(tmp_path):
    store = tmp_path / "store"
    write_images(store, {"x": 10})
    src = tmp_path / "arranged"
    for label, names in {"cat": range(0, 5), "dog": range(5, 10)}.items():
        (src / label).mkdir(parents=True)
        for i in names:
            os.symlink(store / "x" / f"img{i:04d}.jpg", src / label / f"{i}.jpg")
    os.symlink(tmp_path / "nowhere.jpg", src / "cat" / "dangling.jpg")
    os.symlink(store, src / "dog" / "a_folder.jpg")
    plain = tmp_path / "plain"
    done = run_cli("build", "--input", src, "--output", plain, "--num-cores", "2")
    assert done.returncode == 1 and "12 symlink" in done.stderr  # links are never followed by default
    out = tmp_path / "out"
    m = run_job(src, out, "--follow-symlinks", "--num-cores", "2")
    assert m.splits["train"].num_records == 10 and m.splits["train"].class_counts == {"cat": 5, "dog": 5}
    assert rejected(out) == {"cat/dangling.jpg": "symlink", "dog/a_folder.jpg": "symlink"}
    assert by_source(out)["dog/7.jpg"][schema.IMAGE_ENCODED] == (store / "x" / "img0007.jpg").read_bytes()


def test_a_jsonl_listing_in_one_bucket_naming_images_in_two_others(gcs, tmp_path):
    write_images(tmp_path / "a", {"cat": 6}, size=(32, 24))
    write_images(tmp_path / "b", {"dog": 6}, size=(32, 24), seed=50)
    one, two, lists, out_bucket = (gcs.new_bucket(n) for n in ("imgs-a", "imgs-b", "lists", "shards"))
    gcs.upload_tree(tmp_path / "a", one, "photos")
    gcs.upload_tree(tmp_path / "b", two, "more")
    rows = [{"uri": f"gs://{one}/photos/cat/img{i:04d}.jpg", "label": "cat", "split": "train" if i < 4 else "test"}
            for i in range(6)]
    rows += [{"uri": f"gs://{two}/more/dog/img{i:04d}.jpg", "label": "dog", "split": "train" if i < 4 else "test"}
             for i in range(6)]
    rows.append({"uri": f"gs://{two}/more/dog/nope.jpg", "label": "dog", "split": "train"})
    gcs.client.bucket(lists).blob("export/rows.jsonl").upload_from_string(
        "".join(json.dumps(r) + "\n" for r in rows))
    out = f"gs://{out_bucket}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(None, out, "--listing", f"gs://{lists}/export/*.jsonl", "--split-column", "split",
                    "--num-cores", "2")
    assert {name: s.num_records for name, s in m.splits.items()} == {"test": 4, "train": 8}
    assert m.rejected["by_reason"] == {"missing": 1} and m.files_seen == 13
    assert m.options["splits"] == "from column split"
    assert verify(out) == []
