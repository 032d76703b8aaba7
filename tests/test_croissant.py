"""croissant.json and the README.md card: written by every build from its manifest, valid for the real
mlcroissant, checked by verify, never read by the loaders, and printable for a dataset built without them."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
from conftest import run_job
from described import assert_described

from beam_jobs.cli import inspect_command
from beam_jobs.errors import UsageError
from shard_utils.format import croissant
from shard_utils.format.manifest import load
from shard_utils.read.verify import verify


@pytest.fixture
def copy(small_dataset, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(small_dataset, out)
    return out


def test_the_build_describes_its_files_and_counts(small_dataset):
    m = assert_described(small_dataset)
    doc = json.loads((small_dataset / "croissant.json").read_text())
    assert doc["conformsTo"] == croissant.CONFORMS_TO and doc["name"] == small_dataset.name
    records = next(rs for rs in doc["recordSet"] if rs["@id"] == "records")
    label = next(f for f in records["field"] if f["name"] == "image_class_label")
    assert label["references"] == {"field": {"@id": "labels/id"}}
    assert {f["source"]["extract"].get("column") for f in records["field"]} >= set(m.features)
    assert verify(str(small_dataset)) == []


@pytest.mark.slow
def test_mlcroissant_finds_no_error_and_reads_labels_and_splits(small_dataset, monkeypatch):
    import mlcroissant as mlc

    m = load(str(small_dataset))
    ds = mlc.Dataset(jsonld=str(small_dataset / "croissant.json"))  # raises ValidationError on any error
    warnings = ds.metadata.ctx.issues.warnings
    recommended = {w.split('"')[1] for w in warnings}
    assert recommended <= {"https://schema.org/license", "http://mlcommons.org/croissant/citeAs"}
    names = {r["labels/id"]: r["labels/name"] for r in ds.records("labels")}
    assert [names[i] for i in range(len(m.labels))] == [n.encode() if isinstance(n, bytes) else n for n in m.labels]
    assert {r["splits/name"]: r["splits/num_records"] for r in ds.records("splits")} == {
        name: s.num_records for name, s in m.splits.items()}
    monkeypatch.chdir(small_dataset)  # mlcroissant resolves the shards against the working directory
    with pytest.raises(Exception, match=r"Read\(shards\)") as found:
        next(iter(ds.records("records")))  # mlcroissant 1.1 has no TFRecord reader (docs/croissant.md)
    cause = found.value
    while cause.__cause__ or cause.__context__:
        cause = cause.__cause__ or cause.__context__
    assert "application/x-tfrecord" in str(cause)


@pytest.mark.parametrize("hostile", ["checksums", "not json", "huge"])
def test_a_hostile_croissant_json_is_reported_and_never_read_by_loaders(copy, hostile):
    path = copy / "croissant.json"
    if hostile == "checksums":
        doc = json.loads(path.read_text())
        first = next(f for f in doc["distribution"] if f["@type"] == "cr:FileObject")
        first["sha256"] = "0" * 64
        doc["distribution"].append({"@type": "cr:FileObject", "contentUrl": "../elsewhere.tfrecord", "sha256": "0"})
        path.write_text(json.dumps(doc))
        expected = ["croissant.json: lists '../elsewhere.tfrecord', which the manifest does not name",
                    f"croissant.json: {first['contentUrl']}: sha256 or size differs from the manifest"]
    elif hostile == "not json":
        path.write_bytes(b"\xff{not json")
        expected = ["croissant.json: not JSON"]
    else:
        with open(path, "wb") as f:
            f.truncate(croissant.MAX_CROISSANT_BYTES + 10)  # sparse: cheap to make, refused unread
        expected = [f"croissant.json: {croissant.MAX_CROISSANT_BYTES + 1} bytes, more than "
                    f"{croissant.MAX_CROISSANT_BYTES}; not read"]
    assert verify(str(copy)) == expected
    from shard_utils.random_access import RandomAccessSource

    source = RandomAccessSource(str(copy), "train")  # the manifest alone decides what is read
    assert len(source) == load(str(copy)).num_records("train") and source[0]


def test_inspect_prints_and_writes_it_for_a_dataset_built_without_it(copy):
    (copy / "croissant.json").unlink()
    (copy / "README.md").unlink()
    assert verify(str(copy)) == []  # an older dataset: nothing to check
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        inspect_command([str(copy), "--croissant"])
    assert json.loads(printed.getvalue()) == croissant.croissant(load(str(copy)))
    assert not (copy / "croissant.json").exists()
    with contextlib.redirect_stderr(io.StringIO()):
        inspect_command([str(copy), "--write-croissant"])
    assert_described(copy)
    assert verify(str(copy)) == []


@pytest.mark.parametrize("option", [["--url", "ftp://example.com"], ["--name", " "], ["--license", "a\nb"]])
def test_description_options_are_checked(images, tmp_path, option):
    with pytest.raises(UsageError, match=option[0]):
        run_job(images, tmp_path / "out", *option)
    assert not (tmp_path / "out").exists()


def kaggle_shaped(small_dataset):
    """The sample's manifest as a Kaggle-shaped dataset would have it: extra columns (a number, a score, a list of
    tags), an embedding, several labels per record stored from 1, and 60 labels."""
    from dataclasses import replace

    from shard_utils.format import schema

    m = load(str(small_dataset))
    extras = [schema.ExtraSpec("age", "int64"), schema.ExtraSpec("score", "float32"),
              schema.ExtraSpec("tags", "string", is_list=True)]
    features = schema.feature_table(multi_label=True, extras=extras, embedding_key=schema.EMBEDDING,
                                    embedding_shape=[8], max_lengths={schema.LABEL: 3, "extra/tags": 4})
    labels = m.labels + [f"breed {i:02d}" for i in range(60 - len(m.labels))]
    return replace(m, features=features, multi_label=True, label_offset=1, labels=labels,
                   embedding={"key": schema.EMBEDDING, "shape": [8], "model": "tiny.keras"},
                   options={**m.options, "metadata": {"name": "pets", "license": "https://example.com/licence"}})


def test_extra_columns_embeddings_and_many_labels_are_described(small_dataset):
    from shard_utils.read import card

    m = kaggle_shaped(small_dataset)
    doc = croissant.croissant(m)
    fields = {f["name"]: f for rs in doc["recordSet"] if rs["@id"] == "records" for f in rs["field"]}
    assert fields["extra_age"]["dataType"] == "sc:Integer" and "repeated" not in fields["extra_age"]
    assert fields["extra_score"]["dataType"] == "sc:Float"
    assert fields["extra_tags"]["dataType"] == "sc:Text" and fields["extra_tags"]["repeated"]
    assert fields["image_embedding"]["repeated"] and "tiny.keras" in fields["image_embedding"]["description"]
    assert fields["image_class_label"]["repeated"] and fields["image_class_label"]["references"]
    labels = next(rs for rs in doc["recordSet"] if rs["@id"] == "labels")["data"]
    assert [r["labels/id"] for r in labels] == list(range(1, 61))
    text = card.card(m)
    assert "license: other\nlicense_link: \"https://example.com/licence\"" in text
    assert "| 50 | breed 46 |" in text and "| 51 |" not in text and "... and 10 more labels" in text


@pytest.mark.slow
def test_mlcroissant_finds_no_error_in_a_kaggle_shaped_description(small_dataset, tmp_path):
    import mlcroissant as mlc

    path = tmp_path / "croissant.json"
    path.write_bytes(croissant.croissant_bytes(kaggle_shaped(small_dataset)))
    ds = mlc.Dataset(jsonld=str(path))
    assert [r["labels/id"] for r in ds.records("labels")] == list(range(1, 61))
