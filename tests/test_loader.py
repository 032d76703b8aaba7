"""The tf.data loader: output contract, static shapes, per-pipeline sharding, exact padded evaluation,
training under MirroredStrategy on 8 simulated devices, and clear errors for bad datasets."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_job, run_strategy_checks, write_images
from PIL import Image
from readers import all_records, records

tf = pytest.importorskip("tensorflow")

from shard_utils.format import schema  # noqa: E402 - after the skip: the loader imports TensorFlow
from shard_utils.format.manifest import ManifestError  # noqa: E402
from shard_utils.read import loader  # noqa: E402


def contexts(n: int, replicas: int | None = None) -> list:
    """One InputContext per simulated host (each feeding replicas/n replicas)."""
    return [tf.distribute.InputContext(n, i, replicas or n) for i in range(n)]


def source_ids(ds, limit: int | None = None) -> list[str]:
    """Real (weight 1) source ids of an as_dict dataset, in order."""
    out = []
    for batch in ds.take(limit) if limit else ds:
        out += [s.decode() for s, w in zip(batch["source_id"].numpy(), batch["weight"].numpy(), strict=True) if w == 1]
    return out


@pytest.fixture(scope="module")
def small(small_dataset):
    """The shared 32x32 dataset (train 63 records / validation 17, 8 shards each) and its manifest."""
    return small_dataset, loader.load_manifest(str(small_dataset))


@pytest.fixture(scope="module")
def varied(tmp_path_factory):
    """A dataset whose images keep their own sizes (no image_size in the manifest), with a grayscale JPEG."""
    base = tmp_path_factory.mktemp("varied")
    write_images(base / "images", {"a": 7}, size=(50, 40))
    write_images(base / "images", {"b": 6}, size=(30, 60), seed=50)
    Image.fromarray(np.tile(np.arange(36, dtype=np.uint8) * 7, (36, 1)), "L").save(base / "images" / "b" / "gray.jpg")
    out = base / "out"
    run_job(base / "images", out, "--num-cores", "1", "--num-shards", "3")
    return out, loader.load_manifest(str(out))


def copy_dataset(src: Path, dst: Path, edit=None) -> Path:
    """A copy of a dataset whose manifest JSON is passed through `edit` (a function of the dict)."""
    shutil.copytree(src, dst)
    if edit:
        path = dst / "manifest.json"
        obj = json.loads(path.read_text())
        edit(obj)
        path.write_text(json.dumps(obj))
    return dst


# ----------------------------------------------------------------------------- manifest access and steps


def test_manifest_accessors_and_steps(small):
    out, m = small
    assert loader.load_manifest(m) is m
    assert loader.load_manifest(out / "manifest.json").labels == m.labels == ["cat", "dog", "fish"]
    assert m.num_records("train") == 63 and m.num_records("validation") == 17
    assert loader.steps_per_epoch(out, "train", 16) == 63 // 16
    assert loader.eval_steps(m, "validation", 16) == math.ceil(17 / 16)
    # 2 hosts: shards 0,2,4,6 hold 3+2+2+2 records, shards 1,3,5,7 hold 8; per-host batch 4.
    assert [s.num_records for s in m.split("validation").shards] == [3, 2, 2, 2, 2, 2, 2, 2]
    assert loader.eval_steps(m, "validation", 8, num_input_pipelines=2) == 3
    with pytest.raises(ValueError, match="fewer than one global batch"):
        loader.steps_per_epoch(m, "validation", 64)
    with pytest.raises(ValueError, match="not divisible"):
        loader.eval_steps(m, "validation", 9, num_input_pipelines=2)


def test_parse_spec_is_derived_from_the_manifest(small):
    _, m = small
    spec = loader.parse_spec(m)
    assert set(spec) == set(m.features) == set(schema.FEATURES)
    assert spec[schema.IMAGE_ENCODED].dtype == tf.string and spec[schema.LABEL].dtype == tf.int64
    assert all(list(s.shape) == [] for s in spec.values())


# ----------------------------------------------------------------------------- output contract


def test_training_output_contract(small):
    out, m = small
    ds = loader.make_dataset(str(out), "train", 8, seed=0)
    image_spec, label_spec = ds.element_spec
    assert image_spec.shape.as_list() == [8, 32, 32, 3] and image_spec.dtype == tf.float32
    assert label_spec.shape.as_list() == [8] and label_spec.dtype == tf.int32
    for image, label in ds.take(9):  # more than one epoch: training repeats
        assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 1.0
        assert set(label.numpy()) <= set(range(m.num_classes))


def test_images_at_the_manifest_size_are_decoded_unresized_and_scaled(small):
    out, m = small
    expected = {r[schema.SOURCE_ID].decode(): r for r in all_records(out, "validation")}
    ds = loader.make_dataset(m, "validation", 4, training=False, as_dict=True, repeat=False)
    for batch in ds:
        for image, source, label, weight in zip(batch["image"], batch["source_id"].numpy(), batch["label"].numpy(),
                                                batch["weight"].numpy(), strict=True):
            if not weight:
                continue
            record = expected[source.decode()]
            pixels = tf.io.decode_jpeg(record[schema.IMAGE_ENCODED], channels=3).numpy() / 255.0
            np.testing.assert_allclose(image.numpy(), pixels, atol=1e-6)
            assert label == record[schema.LABEL]


def test_dtype_normalization_and_dict_elements(small):
    out, m = small
    ds = loader.make_dataset(m, "train", 4, dtype="bfloat16", mean=0.5, std=[0.25, 0.25, 0.25], as_dict=True)
    spec = ds.element_spec
    assert set(spec) == {"image", "label", "source_id", "weight"}
    assert spec["image"].dtype == tf.bfloat16 and spec["image"].shape.as_list() == [4, 32, 32, 3]
    assert spec["weight"].shape.as_list() == [4] and spec["source_id"].dtype == tf.string
    batch = next(iter(ds))
    image = tf.cast(batch["image"], tf.float32).numpy()
    assert image.min() >= -2.0 - 1e-2 and image.max() <= 2.0 + 1e-2 and image.min() < 0
    assert (batch["weight"].numpy() == 1).all()


def test_augmentation_is_opt_in_and_keeps_static_shapes(small):
    out, m = small
    ds = loader.make_dataset(m, "train", 4, image_size=(24, 28), random_crop=True, random_flip=True, seed=3)
    assert ds.element_spec[0].shape.as_list() == [4, 24, 28, 3]
    for image, _ in ds.take(3):
        assert image.shape == (4, 24, 28, 3) and 0 <= float(tf.reduce_min(image)) <= float(tf.reduce_max(image)) <= 1
    # Off by default: the same record decodes identically in training and evaluation.
    train = {}
    for batch in loader.make_dataset(m, "train", 63, as_dict=True, seed=0).take(2):
        train.update({s.decode(): i.numpy() for s, i in zip(batch["source_id"].numpy(), batch["image"], strict=True)})
    assert len(train) > 50  # the shuffle buffer spans epochs, so a batch may hold repeats
    for batch in loader.make_dataset(m, "train", 63, training=False, as_dict=True, repeat=False):
        for s, i in zip(batch["source_id"].numpy(), batch["image"], strict=True):
            if s.decode() in train:
                np.testing.assert_array_equal(train[s.decode()], i.numpy())


def test_varying_sizes_need_image_size_and_grayscale_gets_three_channels(varied):
    out, m = varied
    assert m.image_size is None
    with pytest.raises(ValueError, match="pass image_size"):
        loader.make_dataset(m, "train", 4)
    ds = loader.make_dataset(m, "train", 14, image_size=20, training=False, as_dict=True, repeat=False)
    assert ds.element_spec["image"].shape.as_list() == [14, 20, 20, 3]
    [batch] = list(ds)
    assert sorted(source_ids(ds)) == sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "train"))
    gray = [i for i, s in enumerate(batch["source_id"].numpy()) if s == b"b/gray.jpg"][0]
    image = batch["image"][gray].numpy()
    np.testing.assert_allclose(image[..., 0], image[..., 1])
    np.testing.assert_allclose(image[..., 0], image[..., 2])


# ----------------------------------------------------------------------------- evaluation across hosts


@pytest.mark.parametrize("hosts", [2, 3, 16])
def test_eval_reads_every_record_once_across_hosts_with_equal_batch_counts(small, hosts):
    out, m = small
    global_batch = 2 * hosts
    steps = loader.eval_steps(m, "validation", global_batch, num_input_pipelines=hosts)
    expected = sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "validation"))
    seen, real_counts = [], []
    with pytest.warns(UserWarning, match="record-level") if hosts > 8 else _no_warning():
        datasets = [loader.make_dataset(m, "validation", 2, training=False, input_context=c, as_dict=True,
                                        repeat=False) for c in contexts(hosts)]
    for ds in datasets:
        batches = list(ds)
        assert len(batches) == steps  # the same on every host, or TPU evaluation hangs
        weights = np.concatenate([b["weight"].numpy() for b in batches])
        assert set(weights) <= {0.0, 1.0} and (np.diff(weights) <= 0).all()  # padding only at the end
        pad = np.concatenate([b["image"].numpy() for b in batches])[weights == 0]
        assert not pad.any()
        real_counts.append(int(weights.sum()))
        seen += source_ids(ds)
    assert sorted(seen) == expected
    if hosts == 2:
        assert real_counts == [9, 8] and steps == 5  # unequal records, equal batches


def test_eval_on_a_host_feeding_several_replicas_pads_whole_steps(small):
    out, m = small
    # 2 hosts x 4 replicas each, per-replica batch 2: a global step takes 8 records from each host.
    steps = loader.eval_steps(m, "validation", 16, num_input_pipelines=2)
    assert steps == 2
    datasets = [loader.make_dataset(m, "validation", 2, training=False, input_context=c, as_dict=True,
                                    repeat=False) for c in contexts(2, replicas=8)]
    assert [len(list(ds)) for ds in datasets] == [steps * 4, steps * 4]
    assert sorted(sum((source_ids(ds) for ds in datasets), [])) == sorted(
        r[schema.SOURCE_ID].decode() for r in all_records(out, "validation"))


def test_eval_tuples_carry_weights_for_keras(small):
    _, m = small
    ds = loader.make_dataset(m, "validation", 5, training=False, repeat=False)
    assert [s.shape.as_list() for s in ds.element_spec] == [[5, 32, 32, 3], [5], [5]]
    weights = np.concatenate([w.numpy() for _, _, w in ds])
    assert len(weights) == 20 and weights.sum() == 17 and ds.cardinality().numpy() == 4
    repeated = loader.make_dataset(m, "validation", 5, training=False)
    assert repeated.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    assert repeated.element_spec == ds.element_spec


def _passes(ds, steps: int, passes: int) -> list[list[tuple[str, float]]]:
    """(source_id, weight) of every example, per pass of `steps` batches of an as_dict dataset."""
    batches = list(ds.take(steps * passes))
    pairs = [[(s.decode(), float(w)) for s, w in zip(b["source_id"].numpy(), b["weight"].numpy(), strict=True)]
             for b in batches]
    return [sum(pairs[p * steps:(p + 1) * steps], []) for p in range(passes)]


@pytest.mark.parametrize("hosts", [1, 2])
def test_eval_repeats_the_same_exact_pass(small, hosts):
    """Keras may keep one validation iterator across epochs: every pass of eval_steps batches is identical."""
    out, m = small
    steps = loader.eval_steps(m, "validation", 4 * hosts, num_input_pipelines=hosts)
    expected = sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "validation"))
    seen = []
    for ctx in contexts(hosts):
        ds = loader.make_dataset(m, "validation", 4, training=False, input_context=ctx, as_dict=True)
        first, second, third = _passes(ds, steps, 3)
        assert first == second == third
        assert [w for _, w in first] == sorted((w for _, w in first), reverse=True)  # padding at the end
        seen += [s for s, w in first if w == 1]
        assert all(s == "" for s, w in first if w == 0)
    assert sorted(seen) == expected


def test_eval_pass_is_a_multiple_of_steps_per_execution(small):
    """Keras 3 runs whole executions of steps_per_execution steps, so a pass is padded to a multiple of it."""
    out, m = small
    assert loader.eval_steps(m, "validation", 4) == 5
    steps = loader.eval_steps(m, "validation", 4, steps_per_execution=3)
    assert steps == 6
    ds = loader.make_dataset(m, "validation", 4, training=False, as_dict=True, steps_per_execution=3, repeat=False)
    batches = list(ds)
    assert len(batches) == steps
    assert not batches[-1]["weight"].numpy().any()  # the added step is all padding
    assert sorted(source_ids(ds)) == sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "validation"))
    with pytest.raises(ValueError, match="steps_per_execution"):
        loader.eval_steps(m, "validation", 4, steps_per_execution=0)
    with pytest.raises(ValueError, match="repeat=False is for evaluation"):
        loader.make_dataset(m, "train", 4, repeat=False)


# ----------------------------------------------------------------------------- training sharding


def _shard_sources(out: Path, m, indices) -> set[str]:
    shards = m.split("train").shards
    return {r[schema.SOURCE_ID].decode() for i in indices for r in records(out / shards[i].path)}


def test_training_pipelines_read_disjoint_fixed_shard_sets(small):
    out, m = small
    for seed in (None, 1, 2):
        for ctx in contexts(2):
            ds = loader.make_dataset(m, "train", 4, input_context=ctx, seed=seed, as_dict=True)
            got = set(source_ids(ds, limit=10))
            assert got <= _shard_sources(out, m, range(ctx.input_pipeline_id, 8, 2))


def test_training_falls_back_to_record_sharding_when_shards_are_too_few(small):
    out, m = small
    seen = []
    with pytest.warns(UserWarning, match="record-level"):
        datasets = [loader.make_dataset(m, "train", 1, input_context=c, seed=5, as_dict=True) for c in contexts(16)]
    for ds in datasets:
        got = set(source_ids(ds, limit=8))
        assert len(got) in (3, 4)
        seen += got
    assert sorted(seen) == sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "train"))


@pytest.fixture(scope="module")
def on_eight_replicas(small) -> dict:
    """The fit and evaluate checks of the small dataset on 8 logical devices, in one process."""
    out, _ = small
    fit, evaluate = run_strategy_checks(("fit", out, "--global-batch", 16, "--epochs", 2,
                                         "--eval-steps-per-execution", 3), ("evaluate", out, "--global-batch", 16))
    return {"fit": fit, "evaluate": evaluate}


@pytest.mark.slow
def test_mirrored_strategy_on_eight_simulated_devices(small, on_eight_replicas):
    """Two Keras epochs through distribute_datasets_from_function, validating after each, then evaluate:
    every evaluation counts each validation record exactly once (issue 9.6: epoch 2 used to stop)."""
    out, _ = small
    result = on_eight_replicas["fit"]
    assert result["replicas"] == 8 and result["steps"] == 63 // 16 and result["vsteps"] == 2
    assert result["train_spec"] == [[2, 32, 32, 3], [2]]
    assert len(result["loss"]) == 2 and np.isfinite(result["loss"]).all()
    assert sorted(result["seen"]) == sorted(r[schema.SOURCE_ID].decode() for r in all_records(out, "validation"))
    # Weight sums: 17 real records in every evaluation, never a padded one nor one counted twice.
    assert result["val_weight_sum"] == [17, 17] and result["eval_weight_sum"] == 17
    assert result["val_accuracy"] == pytest.approx(result["exact_per_epoch"], abs=1e-6)
    assert result["eval_accuracy"] == pytest.approx(result["exact_accuracy"], abs=1e-6)
    # steps_per_execution=3: 2 steps rounded up to 3, so Keras' whole executions never run into the next pass.
    assert result["spe_steps"] == 3 and result["spe_weight_sum"] == [17, 17]
    assert result["spe_accuracy"] == pytest.approx([result["exact_accuracy"]] * 2, abs=1e-6)


@pytest.mark.slow
def test_the_documented_compile_reports_the_exact_validation_loss_on_eight_replicas(on_eight_replicas):
    """17 validation records, a global batch of 16 on 8 replicas: the last step holds 1 real record, so 7 replicas
    see padding only. The loss as a weighted metric (as the README compiles it) is the mean over real records:
    ln 3 for zero logits, the directly computed mean for a random model. Keras's loss is not: the default reduction
    gives the mean x records / padded slots, mean_with_sample_weight counts the all-padding replica batches as 0."""
    result = on_eight_replicas["evaluate"]
    assert (result["records"], result["steps"], result["num_classes"]) == (17, 2, 3)
    zero, random = result["zero"], result["random"]
    assert zero["exact"] == pytest.approx(math.log(3), abs=1e-5)
    assert zero["cross_entropy"] == pytest.approx(math.log(3), abs=1e-4)
    assert random["cross_entropy"] == pytest.approx(random["exact"], abs=1e-4)
    assert abs(random["exact"] - math.log(3)) > 1e-3
    for model in (zero, random):  # the default: a constant factor, records / (steps x global batch)
        assert model["sum_over_batch_size"] == pytest.approx(model["exact"] * 17 / 32, abs=1e-4)
    assert zero["mean_with_sample_weight"] < math.log(3) - 0.05


# ----------------------------------------------------------------------------- errors


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no readable manifest"):
        loader.make_dataset(str(tmp_path / "nowhere"), "train", 4)


def test_unknown_format_version(small, tmp_path):
    ds = copy_dataset(small[0], tmp_path / "d", lambda o: o.update(format_version=99))
    with pytest.raises(ManifestError, match="format_version 99"):
        loader.make_dataset(ds, "train", 4)


def test_schema_without_an_image_feature(small, tmp_path):
    ds = copy_dataset(small[0], tmp_path / "d", lambda o: o["features"].pop(schema.IMAGE_ENCODED))
    with pytest.raises(ManifestError, match="no image feature"):
        loader.make_dataset(ds, "train", 4)


def test_shard_paths_leaving_the_dataset_are_refused(small, tmp_path):
    def escape(obj):
        obj["splits"]["train"]["shards"][0]["path"] = "../elsewhere/train-00000-of-00008.tfrecord"

    ds = copy_dataset(small[0], tmp_path / "d", escape)
    with pytest.raises(ManifestError, match="refused"):
        loader.make_dataset(ds, "train", 4)


def test_missing_shard_file_is_named(small, tmp_path):
    ds = copy_dataset(small[0], tmp_path / "d")
    (ds / "validation-00003-of-00008.tfrecord").unlink()
    with pytest.raises(ManifestError, match="validation-00003-of-00008.tfrecord"):
        loader.make_dataset(ds, "validation", 4, training=False)
    loader.make_dataset(ds, "train", 4)  # other splits still load


def _damage(path: Path, record: int, how: str) -> None:
    """Flip a byte inside record `record`'s data, or cut the file in the middle of that record."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):  # walk the TFRecord framing: 8-byte length, 4-byte CRC, data, 4-byte CRC
        offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
    if how == "flip":
        data[offset + 12 + 20] ^= 0xFF
    else:
        del data[offset + 30:]
    path.write_bytes(bytes(data))


def test_damaged_shard_is_named_in_training(small, tmp_path):
    """Issue 9.7: a corrupted record fails with the shard's name and the command that checks it, through fit."""
    ds_dir = copy_dataset(small[0], tmp_path / "d")
    _damage(ds_dir / "train-00003-of-00008.tfrecord", record=4, how="flip")
    ds = loader.make_dataset(str(ds_dir), "train", 4, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        for _ in ds.take(40):  # 160 records: past the end of every shard
            pass
    message = str(err.value)
    assert "train-00003-of-00008.tfrecord" in message and f"tpu-shards verify {ds_dir}`" in message
    assert "[4] [of the] [8]" in message  # records read before the damage, of the manifest's count
    model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(3)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="train-00003-of-00008.tfrecord"):
        model.fit(ds, epochs=1, steps_per_epoch=40, verbose=0)


def test_damaged_shard_is_named_in_evaluation(small, tmp_path):
    ds_dir = copy_dataset(small[0], tmp_path / "d")
    _damage(ds_dir / "validation-00001-of-00008.tfrecord", record=1, how="truncate")
    for ctx in contexts(2):
        ds = loader.make_dataset(str(ds_dir), "validation", 2, training=False, input_context=ctx, repeat=False,
                                 check_files=False)  # the read-time check (gs:// shards are not checked up front)
        if ctx.input_pipeline_id == 0:
            assert len(list(ds)) == 5  # pipeline 0 reads the even shards: unaffected
            assert loader.make_dataset(str(ds_dir), "validation", 2, training=False, input_context=ctx)
            continue
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"validation-00001-of-00008.tfrecord\] \[is damaged or unreadable: read\] \[1\]"):
            list(ds)
        with pytest.raises(ManifestError, match=r"validation-00001-of-00008.tfrecord holds [0-9]+ bytes, the manifest"):
            loader.make_dataset(str(ds_dir), "validation", 2, training=False, input_context=ctx)  # local: up front


def test_shard_with_more_records_than_the_manifest_lists_is_named(small, tmp_path):
    def undercount(obj):
        split = obj["splits"]["validation"]
        split["shards"][2]["num_records"] -= 1
        split["num_records"] -= 1
        label = next(name for name, n in split["class_counts"].items() if n)
        split["class_counts"][label] -= 1  # the counts agree with the manifest's records
        if split.get("index"):  # the per-record index agrees with the manifest
            split["index"]["num_rows"] -= 1
        obj["files_seen"] -= 1

    ds_dir = copy_dataset(small[0], tmp_path / "d", undercount)
    ds = loader.make_dataset(str(ds_dir), "validation", 4, training=False, repeat=False, check_files=False)
    read_two_of_one = r"validation-00002-of-00008.tfrecord.*read\] \[2\] \[of the\] \[1\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=read_two_of_one):
        list(ds)
    with pytest.raises(ManifestError, match="validation-00002-of-00008.tfrecord holds 2 records, the manifest says 1"):
        loader.make_dataset(str(ds_dir), "validation", 4, training=False, repeat=False)  # local: found up front


def test_bad_arguments(small):
    _, m = small
    with pytest.raises(ManifestError, match="has train, validation"):
        loader.make_dataset(m, "test", 4)
    with pytest.raises(ValueError, match="batch_size"):
        loader.make_dataset(m, "train", 0)
    with pytest.raises(ValueError, match="fewer than one batch"):
        loader.make_dataset(m, "train", 64)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        loader.make_dataset(m, "train", 4, dtype="float16")
    with pytest.raises(ValueError, match="image_size"):
        loader.make_dataset(m, "train", 4, image_size=(0, 3))
    with pytest.raises(TypeError, match="path or a Manifest"):
        loader.make_dataset(42, "train", 4)


def test_loader_imports_only_tensorflow():
    code = ("import sys, shard_utils, shard_utils.loader; "
            "bad = [m for m in ('apache_beam', 'google.cloud.storage') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


class _no_warning:
    """A context manager that fails on any warning (pytest.warns' opposite)."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


def test_importing_the_loader_without_tensorflow_names_the_pip_command():
    """sys.modules[name] = None makes `import tensorflow` fail in that process, as on a machine without it."""
    code = "import sys; sys.modules['tensorflow'] = None; import shard_utils.loader"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("shard_utils.extras.MissingExtra: the loader"), done.stderr
    assert 'pip install -e ".[tf]"' in last, last


def test_a_tensorflow_that_fails_to_import_is_named_with_what_it_misses(tmp_path):
    """TensorFlow installed but its numpy gone: the error names numpy and its pip command, not 'not installed'."""
    from base_install import environment

    done = subprocess.run([sys.executable, "-c", "import shard_utils.loader"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=environment(tmp_path / "site", {"numpy"}))
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last == ("shard_utils.extras.MissingExtra: the loader (shard_utils.loader) needs "
                                             "tensorflow, which is installed but cannot import numpy, a package it "
                                             "needs: pip install numpy"), done.stderr[-2000:]


LOADS = """
import sys
from shard_utils import loader
batch = next(iter(loader.make_dataset(sys.argv[1], "train", 2, training=False, as_dict=True, repeat=False)))
print("read", sorted(batch))
try:
    loader.make_dataset(sys.argv[1], "train", 2, seed=0, start_step=0)
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.slow
@pytest.mark.parametrize("blocked,resumable", [
    ({"fastavro", "PIL", "apache_beam", "google.cloud", "tqdm"}, "MissingExtra shard_utils.random_access needs "
                                                                 "fastavro, which is not installed: pip install -e"),
    ({"google_crc32c"}, None),
])
def test_the_loader_needs_what_the_notebook_page_says(small, tmp_path, blocked, resumable):
    """docs/notebooks.md: TensorFlow and google-crc32c; fastavro for seed=/start_step= (the index). Pillow, Beam,
    the GCS client and tqdm are not needed."""
    from base_install import environment

    done = subprocess.run([sys.executable, "-c", LOADS, str(small[0])], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**environment(tmp_path / "site", blocked), "TF_CPP_MIN_LOG_LEVEL": "3"})
    if resumable is None:  # google-crc32c: every shard check needs it
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1 and "needs google_crc32c, which is not installed" in last, done.stderr[-2000:]
        return
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines[0] == "read ['image', 'label', 'source_id', 'weight']", done.stderr[-2000:]
    assert lines[1].startswith(resumable) and len(lines) == 2, lines
