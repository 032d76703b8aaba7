"""Resumable training input: every global step holds the records `epochs` assigns it, on any pipeline count,
from any start step, without reading what came before; augmentation is part of the step too."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from shard_utils.format.index import read_index  # noqa: E402
from shard_utils.read import epochs, loader  # noqa: E402

SEED, GLOBAL = 11, 8


@pytest.fixture(scope="module")
def train(small_dataset):
    """The shared dataset (63 train records in 8 shards), its manifest and the source id of every row."""
    m = loader.load_manifest(str(small_dataset))
    with open(small_dataset / m.split("train").index.path, "rb") as f:
        ids = [row.source_id for row in read_index(f)]
    return small_dataset, m, ids


def pipeline_steps(m, pipelines: int, start_step: int, steps: int, **kwargs) -> list[list[list[str]]]:
    """[pipeline][step] source ids of `steps` global steps from start_step, each pipeline fed by its InputContext."""
    out = []
    for p in range(pipelines):
        ctx = tf.distribute.InputContext(pipelines, p, pipelines)
        ds = loader.make_dataset(m, "train", GLOBAL // pipelines, input_context=ctx, seed=SEED, as_dict=True,
                                 start_step=start_step, **kwargs)
        out.append([[s.decode() for s in batch["source_id"].numpy()] for batch in ds.take(steps)])
    return out


@pytest.mark.parametrize("pipelines,start", [(1, 0), (2, 5), (4, 5), (8, 13)])
def test_every_global_step_holds_its_assigned_records_on_any_pipeline_count(train, pipelines, start):
    _, m, ids = train
    got = pipeline_steps(m, pipelines, start, steps=10)  # 8 records a step, 63 an epoch: steps straddle epochs
    for k in range(10):
        expected = [ids[r] for r in epochs.batch_rows(SEED, len(ids), GLOBAL, start + k)]
        assert [s for p in range(pipelines) for s in got[p][k]] == expected


def test_a_run_killed_at_step_k_and_resumed_on_other_counts_sees_each_epoch_once(train):
    """Steps 0..4 on 4 pipelines, 5..9 on 2, 10..15 on 8: 128 records, two whole epochs of 63, none repeated."""
    _, m, ids = train
    pieces = [(4, 0, 5), (2, 5, 5), (8, 10, 6)]
    stream = []
    for pipelines, start, steps in pieces:
        got = pipeline_steps(m, pipelines, start, steps)
        stream += [s for k in range(steps) for p in range(pipelines) for s in got[p][k]]
    first, second = stream[:63], stream[63:126]
    assert sorted(first) == sorted(ids) == sorted(second)
    assert first != second  # the next epoch is a new order


def test_augmentation_is_the_same_for_a_step_whatever_the_start_and_pipelines(train):
    _, m, _ = train
    options = dict(seed=SEED, random_crop=True, random_flip=True, as_dict=True)
    whole = loader.make_dataset(m, "train", GLOBAL, start_step=0, **options)
    step_7 = next(iter(whole.skip(7)))
    halves = [next(iter(loader.make_dataset(m, "train", GLOBAL // 2, input_context=tf.distribute.InputContext(2, p, 2),
                                            start_step=7, **options))) for p in range(2)]
    np.testing.assert_array_equal(step_7["image"].numpy(), np.concatenate([h["image"].numpy() for h in halves]))
    plain = next(iter(loader.make_dataset(m, "train", GLOBAL, start_step=7, seed=SEED, as_dict=True)))
    assert not np.array_equal(plain["image"].numpy(), step_7["image"].numpy())  # augmentation did apply


def test_a_resume_never_reads_the_records_before_it(train, tmp_path):
    """Every record of steps 0..5 not also in steps 6..7 is damaged: a resume at step 6 reads on, a start at 0 fails
    naming the shard (so skipped records are not read, not even to be discarded)."""
    out, m, ids = train
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    before = {r for k in range(6) for r in epochs.batch_rows(SEED, len(ids), GLOBAL, k)}
    after = {r for k in (6, 7) for r in epochs.batch_rows(SEED, len(ids), GLOBAL, k)}
    with open(out / m.split("train").index.path, "rb") as f:
        rows = list(read_index(f))
    for r in before - after:
        path = copy / m.split("train").shards[rows[r].shard].path
        data = bytearray(path.read_bytes())
        data[rows[r].offset + 20] ^= 0xFF  # inside the record's data: its CRC fails
        path.write_bytes(bytes(data))
    resumed = loader.make_dataset(str(copy), "train", GLOBAL, seed=SEED, start_step=6, as_dict=True)
    assert [len(b["source_id"]) for b in resumed.take(2)] == [GLOBAL, GLOBAL]
    fresh = loader.make_dataset(str(copy), "train", GLOBAL, seed=SEED, start_step=0)
    with pytest.raises(tf.errors.OpError, match=r"train-0000\d-of-00008.tfrecord.*data checksum mismatch"):
        list(fresh.take(1))


def test_start_example_continues_a_run_whose_global_batch_changed(train):
    _, m, ids = train
    ds = loader.make_dataset(m, "train", 6, seed=SEED, start_example=40, as_dict=True)
    got = [[s.decode() for s in b["source_id"].numpy()] for b in ds.take(4)]
    assert got == [[ids[r] for r in epochs.batch_rows(SEED, len(ids), 6, k, origin=40)] for k in range(4)]


@pytest.mark.parametrize("kwargs,message", [
    (dict(start_step=0), "needs seed="),
    (dict(seed=1, start_step=-1), "start_step must be an int >= 0"),
    (dict(seed=1, start_step=2, start_example=16), "not both"),
    (dict(seed=1, start_step=0, shuffle_buffer_size=64), "shuffle_buffer_size has no effect"),
    (dict(seed=1, start_step=0, training=False), "for training"),
])
def test_bad_resume_arguments_say_what_to_change(train, kwargs, message):
    _, m, _ = train
    with pytest.raises(ValueError, match=message):
        loader.make_dataset(m, "train", 4, **kwargs)


def test_pipelines_that_do_not_divide_the_shards_are_told_once_and_resumable_runs_need_not_be(train):
    """8 shards on 3 hosts: shuffled training warns in one line, saying what it does; the resumable input splits
    every step exactly, so it says nothing and still sees each record once per epoch."""
    import warnings

    _, m, ids = train
    ctx = tf.distribute.InputContext(3, 0, 3)
    with pytest.warns(UserWarning) as caught:
        loader.make_dataset(m, "train", 2, input_context=ctx, seed=SEED)
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message
    assert message.startswith("split 'train' has 8 shards (built for 8 cores x 1 host) for 3 input pipelines: "
                              "pipelines 0-1 read 3 shards, pipeline 2 reads 2") and "start_step=" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps = []
        for p in range(3):
            ds = loader.make_dataset(m, "train", 2, input_context=tf.distribute.InputContext(3, p, 3), seed=SEED,
                                     start_step=0, as_dict=True)
            steps.append([[s.decode() for s in b["source_id"].numpy()] for b in ds.take(11)])  # 11 steps of 6
    stream = [s for k in range(11) for p in range(3) for s in steps[p][k]]
    assert sorted(stream[:63]) == sorted(ids)


def test_resumable_steps_read_from_a_bucket(train, gcs):
    """gs:// through the project's storage layer (the emulator here): the same steps as from the local copy."""
    from shard_utils.format.manifest import load

    out, m, ids = train
    bucket = gcs.new_bucket("resume")
    gcs.upload_tree(out, bucket, "ds")
    remote = load(f"gs://{bucket}/ds")
    ds = loader.make_dataset(remote, "train", GLOBAL, seed=SEED, start_step=3, as_dict=True)
    got = [[s.decode() for s in b["source_id"].numpy()] for b in ds.take(2)]
    assert got == [[ids[r] for r in epochs.batch_rows(SEED, len(ids), GLOBAL, k)] for k in (3, 4)]


def test_a_manifest_naming_a_tpu_this_version_does_not_know_still_loads_and_is_named(train, tmp_path):
    """A newer tpu-shards may record a slice this table lacks: the manifest loads, the loader's message names it."""
    import json

    out, _, _ = train
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["options"]["tpu"] = "v9-64"
    (copy / "manifest.json").write_text(json.dumps(raw))
    m = loader.load_manifest(str(copy))
    assert m.tpu == "v9-64"
    with pytest.warns(UserWarning, match=r"has 8 shards \(built for v9-64\) for 3 input pipelines"):
        loader.make_dataset(m, "train", 2, input_context=tf.distribute.InputContext(3, 1, 3), seed=SEED)
