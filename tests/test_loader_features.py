"""The loader on format-2 datasets: label offsets, multi-label, extra columns, video clips and embeddings.

Label offsets and multi-label listings with extra columns are built by the job itself; video and
embeddings by `synthetic.write_dataset` (exact shapes, cheap to make) with the real schema encoder,
TFRecord framing and manifest. Every expectation comes from the inputs or the records, independently of the loader.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import photo, run_job, run_strategy_checks
from readers import all_records
from synthetic import jpeg, record, write_dataset

tf = pytest.importorskip("tensorflow")

from shard_utils.format import schema  # noqa: E402 - after the skip: the loader imports TensorFlow
from shard_utils.format.manifest import ManifestError  # noqa: E402
from shard_utils.read import loader  # noqa: E402

LABELS = ["cat", "dog", "fish"]
TAGS = schema.ExtraSpec("tags", "string", is_list=True)
IDS = schema.ExtraSpec("ids", "int64", is_list=True)
SCORES = schema.ExtraSpec("scores", "float32", is_list=True)
YEAR = schema.ExtraSpec("year", "int64")
SCORE = schema.ExtraSpec("score", "float32")
CAPTION = schema.ExtraSpec("caption", "string")


def label_sets(i: int) -> tuple[int, ...]:
    """Record i's labels: none, one, or two of the three."""
    return () if i % 7 == 3 else (i % 3,) if i % 2 else (i % 3, (i + 1) % 3)


def extras_of(i: int) -> tuple:
    return ((TAGS, tuple(f"t{i}-{k}" for k in range(i % 4))), (IDS, tuple(range(i % 3))),
            (SCORES, tuple(0.5 * k for k in range(i % 2 + 1))), (YEAR, (2000 + i,)), (SCORE, (i / 4,)),
            (CAPTION, (f"caption {i}",)))


def embedding_of(i: int, label: int, dim: int = 8) -> list[float]:
    """A separable embedding: a bump at the label's position plus deterministic noise."""
    rng = np.random.default_rng(i)
    vector = rng.normal(0, 0.3, dim)
    vector[label * 2] += 2.0
    return [float(v) for v in vector]


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """Multi-label images with every kind of extra column and an embedding, stored with label_offset 1."""
    items = {split: [record(i, label_sets(i), LABELS, offset=1, multi_label=True, extras=extras_of(i),
                            embedding=embedding_of(i, i % 3))
                     for i in range(start, start + count)] for split, start, count in (("train", 0, 24),
                                                                                       ("validation", 100, 10))}
    lengths = {schema.LABEL: 2, schema.LABEL_TEXT: 2, TAGS.key: 3, IDS.key: 2, SCORES.key: 2}
    features = schema.feature_table(multi_label=True, extras=[TAGS, IDS, SCORES, YEAR, SCORE, CAPTION],
                                    embedding_key=schema.EMBEDDING, embedding_shape=[8], max_lengths=lengths)
    out = tmp_path_factory.mktemp("multi")
    m = write_dataset(out, items, LABELS, features, label_offset=1, multi_label=True, image_size=[12, 16],
                      embedding={"key": schema.EMBEDDING, "shape": [8], "model": "synthetic"})
    return out, m, {r.source_id: r for rs in items.values() for r in rs}


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    """Video clips of 3 frames; clip 0 repeats one frame (to see crop and flip act on the whole clip)."""
    def clip(i):
        frames = (jpeg(7, (16, 12)),) * 3 if i == 0 else 3
        return record(i, (i % 3,), LABELS, frames=frames, embedding=embedding_of(i, i % 3, dim=3 * 4))

    items = {"train": [clip(i) for i in range(8)], "validation": [clip(i) for i in range(100, 105)]}
    features = schema.feature_table(media="video", num_frames=3, embedding_key=schema.EMBEDDING,
                                    embedding_shape=[3, 4])
    out = tmp_path_factory.mktemp("video")
    m = write_dataset(out, items, LABELS, features, media="video", image_size=[12, 16],
                      embedding={"key": schema.EMBEDDING, "shape": [3, 4]})
    return out, m, {r.source_id: r for rs in items.values() for r in rs}


def pixels(data: bytes) -> np.ndarray:
    """A JPEG decoded by TensorFlow, scaled to [0, 1] (what the loader yields at the stored size)."""
    return tf.io.decode_jpeg(data, channels=3).numpy() / 255.0


def real_elements(ds) -> list[dict]:
    """The weight-1 examples of an as_dict dataset, unbatched, as NumPy."""
    out = []
    for batch in ds:
        batch = {k: v.numpy() for k, v in batch.items()}
        for j in range(len(batch["weight"])):
            if batch["weight"][j]:
                out.append({k: v[j] for k, v in batch.items()})
    return out


LISTED_LABELS = ["cat", "dog cat", "fish", "dog"]  # listing row i has LISTED_LABELS[i % 4]


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """A job-built dataset from a listing: multi-label rows, extra columns age:int64 and tags:string[],
    stored with --label-offset 1."""
    base = tmp_path_factory.mktemp("listed")
    (base / "in" / "imgs").mkdir(parents=True)
    rows = ["path,label,age,tags"]
    for i in range(12):
        photo(40, 30, i).save(base / "in" / "imgs" / f"{i}.jpg", "JPEG", quality=90)
        rows.append(f"imgs/{i}.jpg,{LISTED_LABELS[i % 4]},{20 + i}," + " ".join(f"t{k}" for k in range(i % 3)))
    (base / "in" / "list.csv").write_text("\n".join(rows) + "\n")
    run_job(base / "in", base / "out", "--listing", base / "in" / "list.csv", "--label-separator", " ",
            "--extra-columns", "age:int64,tags:string[]", "--label-offset", "1", "--image-size", "16",
            "--resize", "fill", "--num-cores", "2", "--splits", "train=0.5,validation=0.5")
    return base / "out", loader.load_manifest(str(base / "out"))


# ----------------------------------------------------------------------------- labels


def test_label_offset_is_subtracted(tmp_path):
    """Records store id + label_offset (the tensorflow/tpu ResNet parser subtracts 1); the loader gives the id."""
    items = {"train": [record(i, (i % 3,), LABELS, offset=1) for i in range(6)]}
    stored = [schema.decode_example(schema.encode_example(r))[schema.LABEL] for r in items["train"]]
    assert stored == [i % 3 + 1 for i in range(6)]
    m = write_dataset(tmp_path / "d", items, LABELS, schema.feature_table(), label_offset=1, image_size=[12, 16])
    assert m.label_offset == 1
    [batch] = list(loader.make_dataset(m, "train", 6, training=False, as_dict=True, repeat=False))
    got = dict(zip((s.decode() for s in batch["source_id"].numpy()), batch["label"].numpy(), strict=True))
    assert got == {r.source_id: int(r.source_id[-1]) % 3 for r in items["train"]}
    assert batch["label"].dtype == tf.int32


def test_job_built_label_offset_is_invisible_to_the_loader(images, tmp_path):
    """--label-offset 1 stores id + 1 (what the tensorflow/tpu ResNet parser expects); the loader gives the id."""
    run_job(images, tmp_path / "out", "--label-offset", "1", "--image-size", "16", "--num-cores", "1")
    stored = {r[schema.SOURCE_ID].decode(): r[schema.LABEL] for r in all_records(tmp_path / "out", "train")}
    m = loader.load_manifest(str(tmp_path / "out"))
    assert m.label_offset == 1 and set(stored.values()) == {1, 2, 3}
    elements = real_elements(loader.make_dataset(m, "train", 4, training=False, as_dict=True, repeat=False))
    assert len(elements) == len(stored) == 36
    for e in elements:
        source = e["source_id"].decode()
        assert e["label"] == stored[source] - 1 == m.labels.index(source.split("/")[0])


def test_job_built_multi_label_listing_with_extras_and_label_offset(listed):
    """The job's own output: multi-hot labels over manifest.labels (offset removed), padded extra lists."""
    out, m = listed
    assert m.multi_label and m.label_offset == 1 and m.labels == ["cat", "dog", "fish"]
    elements = []
    for split in ("train", "validation"):
        elements += real_elements(loader.make_dataset(m, split, 2, training=False, as_dict=True, repeat=False))
    assert len(elements) == 12
    for e in elements:
        i = int(e["source_id"].decode().split("/")[-1].split(".")[0])
        expected = np.array([name in LISTED_LABELS[i % 4].split() for name in m.labels], np.float32)
        np.testing.assert_array_equal(e["label"], expected)
        assert e["extra/age"] == 20 + i
        tags = [f"t{k}".encode() for k in range(i % 3)]
        assert list(e["extra/tags"]) == tags + [b""] * (2 - len(tags)) and e["extra/tags/length"] == len(tags)
        assert e["image"].shape == (16, 16, 3)
    image, label = loader.make_dataset(m, "train", 4, seed=0).element_spec
    assert image.shape.as_list() == [4, 16, 16, 3] and label == tf.TensorSpec([4, 3], tf.float32)


def test_labels_that_do_not_match_the_manifest_fail_clearly(tmp_path):
    items = {"train": [record(i, (i % 3,), LABELS, offset=1) for i in range(6)]}
    m = write_dataset(tmp_path / "d", items, LABELS, schema.feature_table(), label_offset=0, image_size=[12, 16])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"label id\(s\)\] \[3\] \[fall outside 0..2"):
        list(loader.make_dataset(m, "train", 2, training=False, repeat=False))


def test_multi_label_gives_static_multi_hot_vectors(multi):
    out, m, by_id = multi
    ds = loader.make_dataset(m, "train", 4, seed=0)
    assert ds.element_spec[1] == tf.TensorSpec([4, 3], tf.float32)
    evaluation = loader.make_dataset(m, "validation", 4, training=False, as_dict=True, repeat=False)
    assert evaluation.element_spec["label"] == tf.TensorSpec([4, 3], tf.float32)
    seen = 0
    for batch in evaluation:
        for source, label, weight in zip(batch["source_id"].numpy(), batch["label"].numpy(), batch["weight"].numpy(),
                                         strict=True):
            if not weight:
                assert not label.any()  # padding: no class
                continue
            expected = np.zeros(3, np.float32)
            expected[[k - 1 for k in by_id[source.decode()].label_ids]] = 1  # stored with offset 1
            np.testing.assert_array_equal(label, expected)
            seen += 1
    assert seen == 10
    assert any(not label_sets(i) for i in range(100, 110))  # a record without labels is among them


# ----------------------------------------------------------------------------- extras


def test_extra_columns_in_dicts_with_static_padded_lists(multi):
    out, m, by_id = multi
    ds = loader.make_dataset(m, "train", 4, as_dict=True, seed=1)
    spec = ds.element_spec
    assert spec["extra/tags"] == tf.TensorSpec([4, 3], tf.string)
    assert spec["extra/tags/length"] == tf.TensorSpec([4], tf.int32)
    assert spec["extra/ids"] == tf.TensorSpec([4, 2], tf.int64)
    assert spec["extra/scores"] == tf.TensorSpec([4, 2], tf.float32)
    assert spec["extra/year"] == tf.TensorSpec([4], tf.int64)
    assert spec["extra/score"] == tf.TensorSpec([4], tf.float32)
    assert spec["extra/caption"] == tf.TensorSpec([4], tf.string)
    assert "extra/year/length" not in spec
    elements = real_elements(loader.make_dataset(m, "validation", 4, training=False, as_dict=True, repeat=False))
    assert len(elements) == 10
    for e in elements:
        values = dict(by_id[e["source_id"].decode()].extras)
        tags = [t.encode() for t in values[TAGS]]
        assert list(e["extra/tags"]) == tags + [b""] * (3 - len(tags)) and e["extra/tags/length"] == len(tags)
        assert list(e["extra/ids"]) == list(values[IDS]) + [0] * (2 - len(values[IDS]))
        assert e["extra/ids/length"] == len(values[IDS])
        np.testing.assert_allclose(e["extra/scores"][:e["extra/scores/length"]], values[SCORES])
        assert not e["extra/scores"][e["extra/scores/length"]:].any()
        assert e["extra/year"] == values[YEAR][0] and e["extra/caption"] == values[CAPTION][0].encode()
        assert e["extra/score"] == pytest.approx(values[SCORE][0])


def test_extras_stay_out_of_tuples(multi):
    _, m, _ = multi
    image, label = loader.make_dataset(m, "train", 4).element_spec
    assert image.shape.as_list() == [4, 12, 16, 3] and label.shape.as_list() == [4, 3]


def test_a_list_longer_than_its_max_length_fails_clearly(tmp_path):
    items = {"train": [record(i, (0,), LABELS, extras=((IDS, (1, 2, 3)),)) for i in range(4)]}
    features = schema.feature_table(extras=[IDS], max_lengths={IDS.key: 2})
    m = write_dataset(tmp_path / "d", items, LABELS, features, image_size=[12, 16])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[a record has\] \[3\] \[values in extra/ids"):
        list(loader.make_dataset(m, "train", 2, training=False, as_dict=True, repeat=False))


def test_an_extra_named_like_a_length_is_refused(tmp_path):
    clash = schema.ExtraSpec("ids/length", "int64")
    items = {"train": [record(i, (0,), LABELS, extras=((IDS, (1,)), (clash, (1,)))) for i in range(4)]}
    features = schema.feature_table(extras=[IDS, clash], max_lengths={IDS.key: 1})
    m = write_dataset(tmp_path / "d", items, LABELS, features, image_size=[12, 16])
    with pytest.raises(ManifestError, match="collide"):
        loader.make_dataset(m, "train", 2, as_dict=True)
    loader.make_dataset(m, "train", 2)  # tuples do not carry extras


# ----------------------------------------------------------------------------- embeddings


def test_embedding_mode_reads_no_images(tmp_path):
    """features='embedding' yields (embedding, label) without touching the media: here it is not even a JPEG."""
    items = {"train": [record(i, (i % 3,), LABELS, embedding=embedding_of(i, i % 3), encoded=b"not a jpeg",
                              embedding_key="clip/embedding") for i in range(6)]}
    features = schema.feature_table(embedding_key="clip/embedding", embedding_shape=[8])
    m = write_dataset(tmp_path / "d", items, LABELS, features, image_size=[12, 16],
                      embedding={"key": "clip/embedding", "shape": [8]})
    ds = loader.make_dataset(m, "train", 3, training=False, features="embedding", repeat=False)
    assert ds.element_spec == (tf.TensorSpec([3, 8], tf.float32), tf.TensorSpec([3], tf.int32),
                               tf.TensorSpec([3], tf.float32))
    got = {tuple(np.round(e, 5)): int(label) for x, y, _ in ds for e, label in zip(x.numpy(), y.numpy(), strict=True)}
    assert got == {tuple(np.round(np.float32(embedding_of(i, i % 3)), 5)): i % 3 for i in range(6)}
    with pytest.raises(tf.errors.InvalidArgumentError):  # the media path does decode, and fails on these bytes
        list(loader.make_dataset(m, "train", 3, training=False, repeat=False))


def test_embedding_in_dicts_and_mode_errors(multi, tmp_path):
    _, m, by_id = multi
    elements = real_elements(loader.make_dataset(m, "validation", 5, training=False, as_dict=True, repeat=False))
    for e in elements:
        np.testing.assert_allclose(e["embedding"], by_id[e["source_id"].decode()].embedding, rtol=1e-6)
        assert e["image"].shape == (12, 16, 3)
    embedded = loader.make_dataset(m, "train", 4, features="embedding", as_dict=True, seed=0).element_spec
    assert "image" not in embedded and embedded["embedding"].shape.as_list() == [4, 8]
    with pytest.raises(ValueError, match="random_crop and random_flip apply to images"):
        loader.make_dataset(m, "train", 4, features="embedding", random_flip=True)
    with pytest.raises(ValueError, match="features must be one of"):
        loader.make_dataset(m, "train", 4, features="pixels")
    plain = write_dataset(tmp_path / "plain", {"train": [record(i, (0,), LABELS) for i in range(4)]}, LABELS,
                          schema.feature_table(), image_size=[12, 16])
    with pytest.raises(ValueError, match="needs a dataset built with embeddings"):
        loader.make_dataset(plain, "train", 2, features="embedding")


# ----------------------------------------------------------------------------- video


def test_video_clips_are_static_frame_stacks(video):
    out, m, by_id = video
    frames, label = loader.make_dataset(m, "train", 2, seed=0).element_spec
    assert frames == tf.TensorSpec([2, 3, 12, 16, 3], tf.float32) and label == tf.TensorSpec([2], tf.int32)
    elements = real_elements(loader.make_dataset(m, "validation", 2, training=False, as_dict=True, repeat=False))
    assert len(elements) == 5
    for e in elements:
        r = by_id[e["source_id"].decode()]
        assert e["video"].shape == (3, 12, 16, 3) and e["label"] == r.label
        for got, data in zip(e["video"], r.frames, strict=True):
            np.testing.assert_allclose(got, pixels(data), atol=1e-6)
        np.testing.assert_allclose(e["embedding"], np.reshape(r.embedding, (3, 4)), rtol=1e-6)
    small = loader.make_dataset(m, "validation", 5, training=False, image_size=(6, 8), as_dict=True, repeat=False)
    [batch] = list(small)
    first = by_id[batch["source_id"].numpy()[0].decode()]
    expected = tf.image.resize(tf.io.decode_jpeg(first.frames[1], 3), [6, 8]).numpy() / 255.0
    np.testing.assert_allclose(batch["video"][0, 1].numpy(), expected, atol=1e-5)


def test_video_augmentation_is_the_same_for_every_frame_of_a_clip(video):
    """Clip 0 repeats one frame: after random crop and flip its frames must still be identical."""
    _, m, by_id = video
    ds = loader.make_dataset(m, "train", 8, random_crop=True, random_flip=True, as_dict=True, seed=4)
    cropped = 0
    original = pixels(by_id["item0000"].frames[0])
    for batch in ds.take(6):
        for source, clip in zip(batch["source_id"].numpy(), batch["video"].numpy(), strict=True):
            if source == b"item0000":
                assert clip.shape == (3, 12, 16, 3)
                np.testing.assert_array_equal(clip[0], clip[1])
                np.testing.assert_array_equal(clip[0], clip[2])
                cropped += int(not np.allclose(clip[0], original, atol=1e-6))
    assert cropped > 0  # augmentation did act (crops almost never keep the whole frame)


def test_video_embedding_mode(video):
    _, m, _ = video
    x, y = loader.make_dataset(m, "train", 4, features="embedding", seed=0).element_spec
    assert x == tf.TensorSpec([4, 3, 4], tf.float32) and y == tf.TensorSpec([4], tf.int32)


# ----------------------------------------------------------------------------- 8 logical devices


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Records with separable 8-dimensional embeddings and undecodable images, in 8 shards."""
    items = {split: [record(i, (i % 3,), LABELS, embedding=embedding_of(i, i % 3), encoded=b"never decoded")
                     for i in range(start, start + count)] for split, start, count in (("train", 0, 96),
                                                                                       ("validation", 500, 21))}
    features = schema.feature_table(embedding_key=schema.EMBEDDING, embedding_shape=[8])
    out = tmp_path_factory.mktemp("embedded")
    m = write_dataset(out, items, LABELS, features, num_shards=8, embedding={"key": schema.EMBEDDING, "shape": [8]})
    return out, m, items


@pytest.fixture(scope="module")
def on_eight_devices(multi, video, embedded) -> dict:
    """The shapes check of the multi-label and video datasets and a 3-epoch fit on the embeddings, on 8 logical
    devices in one process."""
    shapes, fit = run_strategy_checks(("shapes", multi[0], video[0], "--global-batch", 8),
                                      ("fit", embedded[0], "--features", "embedding", "--global-batch", 16,
                                       "--epochs", 3))
    return {"shapes": shapes, "fit": fit}


@pytest.mark.slow
def test_static_shapes_on_eight_devices(multi, video, on_eight_devices):
    """distribute_datasets_from_function over 8 replicas: every per-replica tensor has a fully static shape."""
    result = on_eight_devices["shapes"]
    multi_found, video_found = result[str(multi[0])], result[str(video[0])]
    for found in (multi_found, video_found):
        for mode in ("train", "eval"):
            assert found[mode]["replicas"] == 8
            for key, shape in found[mode]["spec"].items():
                assert None not in shape and shape[0] == 1, (mode, key, shape)
                assert found[mode]["values"][key] == shape
    assert multi_found["train"]["spec"]["label"] == [1, 3]
    assert multi_found["eval"]["spec"]["extra/tags"] == [1, 3]
    assert multi_found["eval"]["spec"]["embedding"] == [1, 8]
    assert video_found["train"]["spec"]["video"] == [1, 3, 12, 16, 3]


@pytest.mark.slow
def test_keras_head_trains_on_embeddings_on_eight_devices(embedded, on_eight_devices):
    """A Dense head fits precomputed embeddings (no image decoded) for 3 epochs with exact validation."""
    _, m, items = embedded
    assert m.image_size is None  # no image size needed when no image is decoded
    result = on_eight_devices["fit"]
    assert result["train_spec"] == [[2, 8], [2]]
    assert result["val_weight_sum"] == [21, 21, 21] and result["eval_weight_sum"] == 21
    assert result["val_accuracy"] == pytest.approx(result["exact_per_epoch"], abs=1e-6)
    assert sorted(result["seen"]) == sorted(r.source_id for r in items["validation"])
    assert result["loss"][-1] < result["loss"][0]
    assert result["exact_accuracy"] > 0.9  # the embeddings separate the classes
