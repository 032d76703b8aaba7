"""The JAX iterator on 8 CPU devices with the real jax, grain, array-record and orbax: global arrays of the right
shape, dtype and sharding over TFRecord and ArrayRecord datasets, each training step the records `shard_utils.epochs`
assigns it, exact resume from a step or a saved state, and one exact evaluation pass with its mask."""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_job, write_images
from jax_devices import eight_cpu_devices

jax = eight_cpu_devices()  # before anything asks JAX for its devices

from jax.sharding import Mesh, PartitionSpec  # noqa: E402

from shard_utils.format.manifest import load  # noqa: E402
from shard_utils.jax_loader import make_iterator  # noqa: E402
from shard_utils.read import epochs  # noqa: E402
from shard_utils.read.random_access import Decoder, RandomAccessSource  # noqa: E402

SEED = 7


@pytest.fixture(scope="module")
def array_record_dataset(tmp_path_factory):
    """An ArrayRecord-only dataset (no TFRecord, no index): 30 records of 24 x 24."""
    base = tmp_path_factory.mktemp("jax_array_record")
    write_images(base / "images", {"cat": 12, "dog": 10, "fish": 8}, size=(40, 30))
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(base / "images", base / "ds", "--splits", "train=0.7,validation=0.3", "--image-size", "24",
                "--resize", "fill", "--format", "array_record", "--num-cores", "2", "--workers", "1")
    return base / "ds"


@pytest.fixture(params=["tfrecord", "array_record"])
def dataset(request, small_dataset, array_record_dataset):
    return small_dataset if request.param == "tfrecord" else array_record_dataset


def reference(dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 in [0, 1], labels) of every record of a split in index order, read without the iterator."""
    m = load(str(dataset))
    if "tfrecord" in m.formats:
        source = RandomAccessSource(m, split)
        records = [source[i] for i in range(len(source))]
    else:
        import grain

        source = grain.sources.ArrayRecordDataSource(m.array_record_paths(split))
        records = [source[i] for i in range(len(source))]
    decoded = [Decoder.for_manifest(m)(r) for r in records]
    images = np.stack([d["image"] for d in decoded]).astype(np.float32) * np.float32(1 / 255)
    return images, np.array([d["label"] for d in decoded], dtype=np.int32)


def test_batches_are_global_arrays_sharded_on_the_data_axis_of_8_devices(dataset):
    m = load(str(dataset))
    size = m.image_size[0]
    batch = next(make_iterator(dataset, "train", 16, seed=SEED))
    assert sorted(batch) == ["image", "label"]
    image, label = batch["image"], batch["label"]
    assert (image.shape, image.dtype, label.shape, label.dtype) == ((16, size, size, 3), np.float32, (16,), np.int32)
    assert image.sharding.spec == PartitionSpec("data") and image.sharding.mesh.devices.size == 8
    assert [s.data.shape for s in image.addressable_shards] == [(2, size, size, 3)] * 8
    assert sorted(s.index[0].start for s in label.addressable_shards) == list(range(0, 16, 2))


def test_each_training_step_holds_the_records_epochs_assigns_it_across_the_epoch_boundary(dataset):
    images, labels = reference(dataset, "train")
    n, batch = len(labels), 8
    it = make_iterator(dataset, "train", batch, seed=SEED)
    for step in range(n // batch + 2):  # past the end of the first epoch
        rows = epochs.batch_rows(SEED, n, batch, step)
        got = next(it)
        np.testing.assert_array_equal(np.asarray(got["image"]), images[rows])
        np.testing.assert_array_equal(np.asarray(got["label"]), labels[rows])


def test_start_step_and_a_restored_state_continue_exactly(small_dataset):
    it = make_iterator(small_dataset, "train", 8, seed=SEED)
    for _ in range(3):
        next(it)
    state = it.get_state()
    assert state == {"step": 3, "seed": SEED, "global_batch_size": 8, "split": "train", "training": True}
    expected = np.asarray(next(it)["image"])
    np.testing.assert_array_equal(np.asarray(next(make_iterator(small_dataset, "train", 8, seed=SEED,
                                                                start_step=3))["image"]), expected)
    other = make_iterator(small_dataset, "train", 8, seed=SEED)
    other.set_state(state)
    np.testing.assert_array_equal(np.asarray(next(other)["image"]), expected)
    it.set_state(state)  # mid-stream, its threads already reading steps ahead: back to step 3 exactly
    np.testing.assert_array_equal(np.asarray(next(it)["image"]), expected)
    with pytest.raises(ValueError, match="global_batch_size"):
        make_iterator(small_dataset, "train", 16, seed=SEED).set_state(state)


def test_any_thread_count_gives_the_same_batches(small_dataset):
    """Also a state saved with one count and resumed with another (more threads than a batch has rows)."""
    one, three = (make_iterator(small_dataset, "train", 8, seed=SEED, threads=n) for n in (1, 3))
    for _ in range(3):
        a, b = next(one), next(three)
        np.testing.assert_array_equal(np.asarray(a["image"]), np.asarray(b["image"]))
        np.testing.assert_array_equal(np.asarray(a["label"]), np.asarray(b["label"]))
    resumed = make_iterator(small_dataset, "train", 8, seed=SEED, threads=np.int64(20))
    resumed.set_state(three.get_state())
    a, b = next(one), next(resumed)
    np.testing.assert_array_equal(np.asarray(a["image"]), np.asarray(b["image"]))
    np.testing.assert_array_equal(np.asarray(a["label"]), np.asarray(b["label"]))


def test_evaluation_reads_every_record_once_and_masks_the_last_batchs_padding(dataset):
    images, labels = reference(dataset, "validation")
    n, batch = len(labels), 8
    it = make_iterator(dataset, "validation", batch, training=False)
    assert len(it) == -(-n // batch)
    batches = list(it)
    assert len(batches) == len(it) and all(b["mask"].shape == (batch,) for b in batches)
    mask = np.concatenate([np.asarray(b["mask"]) for b in batches])
    assert mask.tolist() == [1.0] * n + [0.0] * (len(mask) - n)  # padding only at the end of the last batch
    got = np.concatenate([np.asarray(b["image"]) for b in batches])
    np.testing.assert_array_equal(got[:n], images)
    assert not got[n:].any()
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["label"]) for b in batches])[:n], labels)


def close_to_pillow(got: np.ndarray, pillow: np.ndarray) -> None:
    """TensorFlow's JPEG decoder upsamples chroma unlike Pillow's: a few levels apart, never more than 16 (stored size,
    no resize)."""
    difference = np.abs(got - pillow) * 255
    assert difference.max() <= 16 and difference.mean() < 3, (difference.max(), difference.mean())


@pytest.mark.tf
def test_the_tensorflow_decoder_gives_each_step_its_records_and_evaluation_its_mask(small_dataset):
    images, labels = reference(small_dataset, "train")
    it = make_iterator(small_dataset, "train", 8, seed=SEED, decoder="tensorflow")
    for step in range(2):
        rows, got = epochs.batch_rows(SEED, len(labels), 8, step), next(it)
        assert got["image"].dtype == np.float32 and got["image"].sharding.spec == PartitionSpec("data")
        np.testing.assert_array_equal(np.asarray(got["label"]), labels[rows])
        close_to_pillow(np.asarray(got["image"]), images[rows])
    images, labels = reference(small_dataset, "validation")
    batches = list(make_iterator(small_dataset, "validation", 8, training=False, decoder="tensorflow"))
    n, mask = len(labels), np.concatenate([np.asarray(b["mask"]) for b in batches])
    assert mask.tolist() == [1.0] * n + [0.0] * (len(mask) - n)
    got = np.concatenate([np.asarray(b["image"]) for b in batches])
    close_to_pillow(got[:n], images)
    assert not got[n:].any()
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["label"]) for b in batches])[:n], labels)


def test_a_mesh_with_a_model_axis_shards_the_batch_on_data_and_replicates_it_on_model(small_dataset):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    batch = next(make_iterator(small_dataset, "train", 8, mesh=mesh, seed=SEED))
    assert batch["image"].sharding.spec == PartitionSpec("data")
    assert [s.data.shape[0] for s in batch["label"].addressable_shards] == [2] * 8  # each row on both model devices
    with pytest.raises(ValueError, match="axis named 'data'"):
        make_iterator(small_dataset, "train", 8, mesh=Mesh(np.array(jax.devices()), ("batch",)))
    with pytest.raises(ValueError, match="does not split evenly over the mesh's 4"):
        make_iterator(small_dataset, "train", 6, mesh=mesh)


@pytest.mark.parametrize("kwargs,message", [
    ({"start_step": -1}, "start_step must be an int >= 0"),
    ({"seed": "x"}, "seed must be an int or None"),
    ({"image_size": 0}, "image_size must be a positive int"),
    ({"decoder": "cv2"}, "decoder must be one of 'pillow', 'tensorflow'"),
    ({"threads": 0}, "threads must be a positive int, got 0"),
    ({"threads": 2.0}, "threads must be a positive int, got 2.0"),
    ({"threads": -3}, "threads must be a positive int, got -3"),
    ({"threads": True}, "threads must be a positive int, got True"),
    ({"threads": "8"}, "threads must be a positive int, got '8'"),
])
def test_bad_arguments_are_one_clear_line(small_dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_iterator(small_dataset, "train", 8, **kwargs)


def test_the_state_saved_with_orbax_beside_the_model_resumes_the_input(small_dataset, tmp_path):
    import orbax.checkpoint as ocp

    it = make_iterator(small_dataset, "train", 8, seed=SEED)
    next(it)
    params = {"w": jax.numpy.arange(4.0)}
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             data=ocp.args.JsonSave(it.get_state())))
        mngr.wait_until_finished()
        restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(params), data=ocp.args.JsonRestore()))
    resumed = make_iterator(small_dataset, "train", 8, seed=SEED)
    resumed.set_state(restored["data"])
    np.testing.assert_array_equal(np.asarray(next(resumed)["image"]), np.asarray(next(it)["image"]))


def docs_snippet(page: str, marker: str) -> str:
    """The Python block after `<!-- test: MARKER -->` in docs/PAGE."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    [snippet] = re.findall(rf"<!-- test: {marker} -->\n```python\n(.*?)```", text, re.S)
    return snippet


@pytest.mark.slow  # about 3 CPU seconds: compiling, 30 steps, 4 Orbax checkpoints
def test_the_docs_jax_loop_and_its_orbax_resume_run_as_written(small_dataset, tmp_path, monkeypatch, capsys):
    """docs/loader.md's JAX loop, then docs/resume.md's Orbax loop; that one run again after its last checkpoint
    is removed resumes at step 8 and ends with the very parameters of the run it replaces."""
    (tmp_path / "sample_output").symlink_to(small_dataset)
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(docs_snippet("loader.md", "jax snippet"), "loader.md", "exec"), names)
    assert re.search(r"step 10: accuracy [01]\.\d\d over 17 validation records", capsys.readouterr().out)
    resume = compile(docs_snippet("resume.md", "jax resume snippet"), "resume.md", "exec")
    exec(resume, names)
    whole = jax.tree.map(np.asarray, names["params"])
    shutil.rmtree(tmp_path / "ckpt" / "12")
    exec(resume, names)
    assert capsys.readouterr().out.split() == ["START", "0", "START", "8"]
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, names["params"]), whole)


def test_without_jax_the_module_imports_and_make_iterator_names_the_extra(small_dataset):
    blocked = "import sys; sys.modules['jax'] = None; from shard_utils import jax_loader; "
    done = subprocess.run([sys.executable, "-c", blocked + f"jax_loader.make_iterator({str(small_dataset)!r}, "
                           "'train', 8)"], capture_output=True, text=True, timeout=120, cwd=REPO)
    last = done.stderr.splitlines()[-1]
    assert done.returncode == 1 and "MissingExtra: shard_utils.jax_loader needs jax, which is not installed" in last
    assert last.endswith('[jax]"'), last  # pip's command for the extra


def test_a_dataset_in_a_bucket_gives_the_same_batches_as_its_local_copy(small_dataset, gcs):
    """make_iterator over gs:// (the storage emulator): the manifest, the index and each record read from the bucket."""
    bucket = gcs.new_bucket("jax")
    gcs.upload_tree(small_dataset, bucket, "ds")
    remote = make_iterator(f"gs://{bucket}/ds", "train", 8, seed=SEED, start_step=5)
    local = make_iterator(small_dataset, "train", 8, seed=SEED, start_step=5)
    for _ in range(3):
        a, b = next(remote), next(local)
        np.testing.assert_array_equal(np.asarray(a["image"]), np.asarray(b["image"]))
        np.testing.assert_array_equal(np.asarray(a["label"]), np.asarray(b["label"]))


def test_a_resize_gives_the_decoders_pixels_and_padding_rows_are_zeros(small_dataset):
    m = load(str(small_dataset))
    source, decode = RandomAccessSource(m, "validation"), Decoder.for_manifest(m, (20, 12))
    expected = np.stack([decode(source[i])["image"] for i in range(len(source))]) * np.float32(1 / 255)
    batches = list(make_iterator(m, "validation", 16, training=False, image_size=(20, 12), threads=3))
    got = np.concatenate([np.asarray(b["image"]) for b in batches])
    assert got.shape == (len(batches) * 16, 20, 12, 3) and len(source) % 16
    np.testing.assert_array_equal(got[:len(source)], expected)
    assert not got[len(source):].any()


def test_multi_label_hot_vectors_and_a_record_that_does_not_decode(tmp_path):
    from index_helpers import image_record, write_dataset

    labels = ["a", "b", "c"]
    records = [image_record(i, [i % 3, (i + 1) % 3] if i % 4 else [], labels, multi_label=True, label_offset=1)
               for i in range(16)]
    m = write_dataset(tmp_path / "ml", {"train": [records[:8], records[8:]]}, labels, multi_label=True,
                      label_offset=1)
    hot = next(make_iterator(m, "train", 16, training=False, image_size=8))["label"]
    assert hot.dtype == np.float32 and hot.shape == (16, 3)
    np.testing.assert_array_equal(np.asarray(hot), [[1.0 * (k in (i % 3, (i + 1) % 3)) * bool(i % 4)
                                                     for k in range(3)] for i in range(16)])
    import dataclasses

    broken = dataclasses.replace(records[5], encoded=b"not a jpeg")
    m = write_dataset(tmp_path / "bad", {"train": [records[:5] + [broken] + records[6:8], records[8:]]}, labels,
                      multi_label=True, label_offset=1)
    with pytest.raises(ValueError, match="record 'img/00005.jpg': image does not decode"):
        next(make_iterator(m, "train", 16, training=False, image_size=8))


def _loader_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("jax_loader")]


def test_a_record_that_does_not_decode_is_raised_again_at_the_same_step_and_closing_stops_the_threads(tmp_path):
    """A broken record mid-batch: its error each time its step is asked for (not the end of an endless input), the
    step unchanged; the steps before it read as ever; an iterator closed early leaves no decode thread running."""
    import dataclasses
    import gc

    from index_helpers import image_record, write_dataset

    labels = ["a", "b"]
    records = [image_record(i, [i % 2], labels) for i in range(16)]
    records[11] = dataclasses.replace(records[11], encoded=b"not a jpeg")
    m = write_dataset(tmp_path / "bad", {"train": [records[:8], records[8:]]}, labels)
    before = set(_loader_threads())
    it = make_iterator(m, "train", 8, training=False, image_size=8, threads=3)
    first = next(it)
    assert it.step == 1 and np.asarray(first["mask"]).all()
    for _ in range(2):
        with pytest.raises(ValueError, match="record 'img/00011.jpg': image does not decode"):
            next(it)
        assert it.step == 1
    it.set_state({**it.get_state(), "step": 0})
    np.testing.assert_array_equal(np.asarray(next(it)["image"]), np.asarray(first["image"]))
    del it
    gc.collect()
    for thread in set(_loader_threads()) - before:
        thread.join(10)
        assert not thread.is_alive(), thread.name


def test_close_stops_the_decode_threads_and_a_state_saved_before_it_resumes(small_dataset):
    """close() returns with every decode thread of the iterator ended (three batches were in flight), is idempotent,
    and leaves next() a clear error; `with` closes; an iterator dropped unclosed is freed and stopped at once,
    without the cyclic garbage collector; the state saved before close resumes the next step exactly."""
    import gc
    import threading

    before = set(threading.enumerate())
    it = make_iterator(small_dataset, "train", 8, seed=SEED, threads=3)
    next(it)
    state = it.get_state()
    mine = [t for t in set(_loader_threads()) - before]
    assert mine  # reading ahead
    it.close()
    assert [t.name for t in mine if t.is_alive()] == []  # joined by close(), not left to end on their own
    it.close()
    with pytest.raises(ValueError, match="the iterator is closed"):
        next(it)
    assert it.get_state() == state
    resumed = make_iterator(small_dataset, "train", 8, seed=SEED, start_step=state["step"])
    expected = np.asarray(next(resumed)["image"])
    resumed.close()
    with make_iterator(small_dataset, "train", 8, seed=SEED) as again:
        again.set_state(state)
        np.testing.assert_array_equal(np.asarray(next(again)["image"]), expected)
        inside = set(_loader_threads()) - before
    with pytest.raises(ValueError, match="closed"):
        next(again)
    assert not [t for t in inside if t.is_alive()]
    gc.disable()  # dropped: reference counting alone must free the iterator and stop its threads
    try:
        dropped = make_iterator(small_dataset, "train", 8, seed=SEED, threads=3)
        next(dropped)
        left = set(_loader_threads()) - before
        del dropped
        for thread in left:
            thread.join(10)
        assert not [t.name for t in left if t.is_alive()]
    finally:
        gc.enable()
