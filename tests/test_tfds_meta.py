"""TFDS metadata from the manifest, loaded by the real tensorflow-datasets on datasets the job built."""
import dataclasses
import json
import shutil

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from index_helpers import framed_records, image_record, write_dataset

from shard_utils.format import manifest as manifest_mod
from shard_utils.format import schema
from shard_utils.read.tfds_meta import DATASET_INFO, FEATURES, LABELS, tfds_files


def publish(out):
    """Write the TFDS files beside the shards, as the job's publish step will."""
    for name, data in tfds_files(manifest_mod.load(str(out))).items():
        (out / name).write_bytes(data)
    return tfds.builder_from_directory(str(out))


def shard_order(out, split):
    m = manifest_mod.load(str(out))
    return [schema.decode_example(d) for s in m.split(split).shards for _, _, d in framed_records(out / s.path)]


def source_ids(builder, split):
    return [ex["image/source_id"].decode() for ex in tfds.as_numpy(builder.as_dataset(split=split))]


@pytest.fixture
def copy(small_dataset, tmp_path):
    shutil.copytree(small_dataset, tmp_path / "ds")
    return tmp_path / "ds"


def test_only_the_files_tfds_reads(small_dataset):
    files = tfds_files(manifest_mod.load(str(small_dataset)))
    assert set(files) == {DATASET_INFO, FEATURES, LABELS}
    info = json.loads(files[DATASET_INFO])
    assert set(info) == {"name", "version", "fileFormat", "description", "splits", "supervisedKeys"}
    assert info["splits"][0]["filepathTemplate"] == "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"
    assert files[LABELS].decode().splitlines() == ["cat", "dog", "fish"]


def test_builder_loads_every_split_with_counts_shards_and_features(copy):
    builder = publish(copy)
    m = manifest_mod.load(str(copy))
    assert set(builder.info.splits) == set(m.splits)
    for name, split in m.splits.items():
        info = builder.info.splits[name]
        assert info.num_examples == split.num_records and info.num_bytes == split.num_bytes
        assert info.shard_lengths == [s.num_records for s in split.shards]
        assert [p.split("/")[-1] for p in map(str, info.filenames)] == [s.path for s in split.shards]
    label = builder.info.features["image/class/label"]
    assert label.names == m.labels
    records = shard_order(copy, "validation")
    got = list(tfds.as_numpy(builder.as_dataset(split="validation")))
    assert [ex["image/source_id"].decode() for ex in got] == [r[schema.SOURCE_ID].decode() for r in records]
    for ex, record in zip(got, records, strict=True):
        assert ex["image/class/label"] == record[schema.LABEL]
        assert label.int2str(ex["image/class/label"]) == record[schema.LABEL_TEXT].decode()
        assert ex["image/encoded"].shape == (32, 32, 3)
        assert (ex["image/encoded"] == tf.io.decode_jpeg(record[schema.IMAGE_ENCODED]).numpy()).all()


def test_slices_even_splits_and_jax_processes(copy):
    builder = publish(copy)
    everything = [r[schema.SOURCE_ID].decode() for r in shard_order(copy, "train")]
    tenth = source_ids(builder, "train[:10%]")
    assert tenth == everything[:len(tenth)] and len(tenth) == round(len(everything) / 10)
    parts = [source_ids(builder, s) for s in tfds.even_splits("train", n=3)]
    assert sorted(sum(parts, [])) == sorted(everything) and max(map(len, parts)) - min(map(len, parts)) <= 1
    hosts = [source_ids(builder, tfds.split_for_jax_process("train", process_index=i, process_count=2))
             for i in range(2)]
    assert not set(hosts[0]) & set(hosts[1]) and sorted(hosts[0] + hosts[1]) == sorted(everything)


def test_tfrec_shards_keep_their_names(copy):
    raw = json.loads((copy / "manifest.json").read_text())
    for split in raw["splits"].values():
        for shard in split["shards"]:
            (copy / shard["path"]).rename(copy / (shard["path"][:-len(".tfrecord")] + ".tfrec"))
            shard["path"] = shard["path"][:-len(".tfrecord")] + ".tfrec"
    (copy / "manifest.json").write_text(json.dumps(raw))
    builder = publish(copy)
    assert json.loads((copy / DATASET_INFO).read_text())["splits"][0]["filepathTemplate"].endswith(".tfrec")
    assert sorted(source_ids(builder, "validation")) == sorted(
        r[schema.SOURCE_ID].decode() for r in shard_order(copy, "validation"))


def test_label_offset_and_multi_label(tmp_path):
    labels = ["a", "b", "c"]
    single = write_dataset(tmp_path / "single", {"train": [[image_record(i, [i % 3], labels, label_offset=1)
                                                           for i in range(4)]]}, labels, label_offset=1)
    builder = publish(tmp_path / "single")
    label = builder.info.features["image/class/label"]
    assert label.names == ["unused-0", "a", "b", "c"] and single.label_offset == 1
    got = [label.int2str(ex["image/class/label"]) for ex in tfds.as_numpy(builder.as_dataset(split="train"))]
    assert got == ["a", "b", "c", "a"]
    write_dataset(tmp_path / "multi", {"train": [[image_record(i, list(range(i % 3 + 1)), labels, multi_label=True)
                                                  for i in range(3)]]}, labels, multi_label=True)
    builder = publish(tmp_path / "multi")
    got = [ex["image/class/label"].tolist() for ex in tfds.as_numpy(builder.as_dataset(split="train"))]
    assert got == [[0], [0, 1], [0, 1, 2]]
    pairs = tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True))
    assert [(image.shape, label.tolist()) for image, label in pairs] == [((16, 24, 3), [0]), ((16, 24, 3), [0, 1]),
                                                                         ((16, 24, 3), [0, 1, 2])]


def test_what_tfds_cannot_read_is_refused(small_dataset):
    m = manifest_mod.load(str(small_dataset))
    with pytest.raises(ValueError, match="image datasets"):
        tfds_files(dataclasses.replace(m, media="video"))
    renamed = dict(m.splits)
    renamed["train.v2"] = renamed.pop("train")
    with pytest.raises(ValueError, match="'train.v2' is not a TFDS split name"):
        tfds_files(dataclasses.replace(m, splits=renamed))
    with pytest.raises(ValueError, match="cannot be a TFDS class name"):
        tfds_files(dataclasses.replace(m, labels=["cat", " dog"]))
    split = m.split("train")
    moved = dataclasses.replace(split, shards=[dataclasses.replace(split.shards[0], path="x/" + split.shards[0].path)]
                                + split.shards[1:])
    with pytest.raises(ValueError, match="not named as TFDS expects"):
        tfds_files(dataclasses.replace(m, splits={**m.splits, "train": moved}))


def test_as_supervised_gives_image_and_label_pairs(copy):
    builder = publish(copy)
    assert builder.info.supervised_keys == ("image/encoded", "image/class/label")
    records = shard_order(copy, "validation")
    pairs = list(tfds.as_numpy(builder.as_dataset(split="validation", as_supervised=True)))
    assert len(pairs) == len(records)
    for (image, label), record in zip(pairs, records, strict=True):
        assert label == record[schema.LABEL]
        assert (image == tf.io.decode_jpeg(record[schema.IMAGE_ENCODED]).numpy()).all()
