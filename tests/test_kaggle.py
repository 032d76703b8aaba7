"""The Kaggle workflow end to end on a Kaggle-shaped competition (tests/kaggle_comp.py): a listing with numeric labels
0-11 built with --path-template, an unlabeled test folder built as its own dataset, two epochs on 8 replicas, the
test split predicted exactly once and docs/loader.md's submission snippet writing submission.csv in the sample
submission's order. Also what every reader and tool makes of the unlabeled split."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_job
from kaggle_comp import competition

from shard_utils.format import schema
from shard_utils.format.index import read_index
from shard_utils.format.manifest import load
from shard_utils.read.stored import iter_split, label_texts
from shard_utils.read.verify import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory):
    """comp/ and its two datasets, train_shards/ (from train.csv) and test_shards/ (test_images/, unlabeled)."""
    root = tmp_path_factory.mktemp("kaggle")
    comp = competition(root / "comp")
    run_job(comp, root / "train_shards", "--listing", comp / "train.csv", "--path-template", "train_images/{}.jpg",
            "--splits", "train=1", "--image-size", 16, "--num-cores", 2)
    run_job(comp / "test_images", root / "test_shards", "--splits", "test=1", "--image-size", 16, "--num-cores", 2)
    return root


def submission_ids(root) -> list[str]:
    return [row["id"] for row in csv.DictReader(open(root / "comp" / "sample_submission.csv"))]


def test_numeric_labels_keep_their_numbers_as_ids_and_the_test_folder_is_unlabeled(kaggle):
    train = load(str(kaggle / "train_shards"))
    assert train.labels == [str(i) for i in range(12)]  # not string order ('0', '1', '10', '11', '2', ...)
    listed = {row["id"]: row["label"] for row in csv.DictReader(open(kaggle / "comp" / "train.csv"))}
    records = list(iter_split(train, "train"))
    assert len(records) == 60
    for record in records:  # the stored id is the CSV's label itself
        assert record.label_ids == [int(listed[record.source_id[len("train_images/"):-len(".jpg")]])]
    test = load(str(kaggle / "test_shards"))
    split = test.split("test")
    assert test.labels == [] and split.num_records == split.unlabeled == 24 and not split.labeled
    assert split.class_counts == {} and train.split("train").labeled
    assert json.loads((kaggle / "test_shards" / "manifest.json").read_text())["splits"]["test"]["unlabeled"] == 24
    stored = list(iter_split(test, "test"))
    assert sorted(r.source_id[:-4] for r in stored) == sorted(submission_ids(kaggle))
    assert {(tuple(r.label_ids), tuple(r.label_texts)) for r in stored} == {((schema.NO_LABEL,), ("",))}
    assert all(label_texts(test, r) == [] for r in stored)
    with open(kaggle / "test_shards" / split.index.path, "rb") as f:
        assert {(row.label, row.labels) for row in read_index(f)} == {(-1, ())}
    assert verify(str(kaggle / "test_shards"), deep=True) == []
    assert verify(str(kaggle / "train_shards"), deep=True) == []


@pytest.mark.tf
def test_train_on_8_replicas_predict_the_test_split_once_and_write_the_submission_in_its_order(kaggle):
    done = subprocess.run([sys.executable, str(REPO / "tests" / "kaggle_run.py")], cwd=kaggle, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["replicas"] == 8 and "24 predictions written to submission.csv" in done.stdout
    rows = list(csv.reader(open(kaggle / "submission.csv", newline="")))
    assert rows[0] == ["id", "label"]
    assert [r[0] for r in rows[1:]] == submission_ids(kaggle)  # every id once, in the sample submission's order
    # Row by row, the label is the model's prediction for that id's own file (not a neighbour's).
    assert [r[1] for r in rows[1:]] == [found["own"][i] for i in submission_ids(kaggle)]
    assert len({r[1] for r in rows[1:]}) >= 2  # predictions differ, so a shuffled pairing would show


@pytest.mark.tf
def test_the_unlabeled_split_through_the_loader_grain_and_tfds(kaggle, tmp_path):
    import shutil

    import tensorflow_datasets as tfds

    from shard_utils import loader
    from shard_utils.read.random_access import Decoder, RandomAccessSource
    from shard_utils.read.tfds_meta import tfds_files

    m = loader.load_manifest(str(kaggle / "test_shards"))
    with pytest.raises(ValueError, match="split 'test' has no labels .* training=False"):
        loader.make_dataset(m, "test", 8)
    passes = [[s.decode() for _, ids in loader.make_dataset(m, "test", 5, training=False, repeat=False)
               for s in ids.numpy()] for _ in range(2)]
    assert passes[0] == passes[1] and len(passes[0]) == 25 and passes[0][-1] == ""  # stable; one padding element
    assert sorted(passes[0][:-1]) == sorted(f"{i}.jpg" for i in submission_ids(kaggle))
    batch = next(iter(loader.make_dataset(m, "test", 4, training=False, as_dict=True)))
    assert set(batch) == {"image", "source_id", "weight"} and batch["image"].shape == (4, 16, 16, 3)
    source = RandomAccessSource(m, "test")
    decoded = [Decoder.for_source(source)(source[i]) for i in range(len(source))]
    assert {int(d["label"]) for d in decoded} == {-1}
    assert sorted(d["source_id"] for d in decoded) == sorted(passes[0][:-1])
    shutil.copytree(kaggle / "test_shards", tmp_path / "ds")
    for name, data in tfds_files(m).items():
        (tmp_path / "ds" / name).write_bytes(data)
    builder = tfds.builder_from_directory(str(tmp_path / "ds"))
    assert builder.info.supervised_keys is None
    examples = list(tfds.as_numpy(builder.as_dataset(split="test")))
    assert {int(e["image/class/label"]) for e in examples} == {-1} and len(examples) == 24


def test_extract_and_inspect_take_the_listing_s_ids_and_the_unlabeled_split(kaggle, tmp_path, capsys):
    from beam_jobs.cli import inspect_command
    from shard_utils.read.extract import ExtractError, extract

    first = next(csv.DictReader(open(kaggle / "comp" / "train.csv")))
    done = extract(str(kaggle / "train_shards"), str(tmp_path / "one"), source_id=first["id"])  # the CSV's id
    assert done.count == 1
    [written] = (tmp_path / "one" / "train" / first["label"]).iterdir()
    assert written.name == f"{first['id']}.jpg"
    typo = first["id"][:-1] + ("x" if first["id"][-1] != "x" else "y")
    with pytest.raises(ExtractError, match=rf"no record in split\(s\) train has source id '{typo}'.*closest source "
                                           rf"ids: 'train_images/{first['id']}.jpg'"):
        extract(str(kaggle / "train_shards"), str(tmp_path / "none"), source_id=typo)
    assert not (tmp_path / "none").exists()
    test_id = submission_ids(kaggle)[0]
    done = extract(str(kaggle / "test_shards"), str(tmp_path / "test"), source_id=test_id)  # a file name's stem
    assert done.count == 1 and (tmp_path / "test" / "test" / "unlabeled" / f"{test_id}.jpg").is_file()
    inspect_command([str(kaggle / "test_shards")])
    assert "test: 24 records (unlabeled)," in capsys.readouterr().out


def test_listing_rows_without_labels_build_unlabeled_and_an_unlabeled_dataset_takes_no_labeled_append(tmp_path):
    from shard_utils.errors import PlanError

    comp = competition(tmp_path / "comp", train=8, test=0)
    ids = [row["id"] for row in csv.DictReader(open(comp / "train.csv"))]
    cells = ['"label": []', '"label": null', '"label": ""', '"label": " "']
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"path": "train_images/{i}.jpg", {cell}}}\n'
                                                 for i, cell in zip(ids, cells, strict=False)))
    out = tmp_path / "out"
    options = ("--splits", "test=1", "--num-cores", 2)
    m = run_job(comp, out, "--listing", tmp_path / "rows.jsonl", *options)
    assert m.labels == [] and m.split("test").unlabeled == 4 and m.rejected["count"] == 0
    (tmp_path / "more.jsonl").write_text("".join(f'{{"path": "train_images/{i}.jpg", "label": "{k}"}}\n'
                                                 for k, i in enumerate(ids[4:])))
    with pytest.raises(PlanError, match="this dataset is unlabeled, and the new media have labels .*'0', '1'"):
        run_job(comp, out, "--append", "--listing", tmp_path / "more.jsonl", *options)
    assert load(str(out)).split("test").num_records == 4  # the dataset is as it was
