"""The loader, its step counts and the Grain source on split expressions: each record of the expression once per
evaluation pass on any pipeline count, folds trained on together, resume on an expression, and an unknown split
named before anything else."""
from __future__ import annotations

import pytest
from synthetic import record, write_dataset

tf = pytest.importorskip("tensorflow")

from shard_utils.format import schema  # noqa: E402
from shard_utils.format.index import read_index  # noqa: E402
from shard_utils.format.manifest import ManifestError  # noqa: E402
from shard_utils.read import epochs, loader  # noqa: E402
from shard_utils.read.random_access import RandomAccessSource  # noqa: E402


@pytest.fixture(scope="module")
def small(small_dataset):
    """The shared dataset (train 63 records, validation 17, 8 shards each), its manifest and each split's source
    ids in row order."""
    m = loader.load_manifest(str(small_dataset))
    ids = {}
    for name, split in m.splits.items():
        with open(small_dataset / split.index.path, "rb") as f:
            ids[name] = [row.source_id for row in read_index(f)]
    return m, ids


def real_ids(ds) -> list[str]:
    return [s.decode() for batch in ds
            for s, w in zip(batch["source_id"].numpy(), batch["weight"].numpy(), strict=True) if w]


@pytest.mark.slow
@pytest.mark.parametrize("expression,rows", [
    ("train[:80%]", [("train", slice(0, 50))]),  # 50.4 rounds to 50
    ("train[10:20]+validation", [("train", slice(10, 20)), ("validation", slice(None))]),
    (["validation", "train[-5:]"], [("validation", slice(None)), ("train", slice(58, None))]),
    ("train[:3shard]", [("train", slice(0, 24))]),
])
def test_evaluation_reads_each_record_of_an_expression_once_on_any_pipeline_count(small, expression, rows):
    m, ids = small
    expected = [i for name, part in rows for i in ids[name][part]]
    assert m.num_records(expression) == len(expected)
    for pipelines in (1, 3):
        steps = loader.eval_steps(m, expression, 4 * pipelines, num_input_pipelines=pipelines)
        seen = []
        for p in range(pipelines):
            ctx = tf.distribute.InputContext(pipelines, p, pipelines)
            ds = loader.make_dataset(m, expression, 4, training=False, input_context=ctx, as_dict=True, repeat=False)
            assert len(list(ds)) == steps  # every pipeline the same number of batches
            seen += real_ids(ds)
        assert sorted(seen) == sorted(expected) and len(set(seen)) == len(seen)


@pytest.fixture(scope="module")
def folds(tmp_path_factory):
    """Folds built as --split-column fold makes them (fold0..fold2, 2 shards each), without image_size."""
    labels = ["a", "b", "c"]
    items = {f"fold{k}": [record(10 * k + i, (i % 3,), labels) for i in range(5 + k)] for k in range(3)}
    return write_dataset(tmp_path_factory.mktemp("folds"), items, labels, schema.feature_table()), items


def test_folds_are_trained_and_evaluated_together(folds):
    m, items = folds
    wanted = {r.source_id for k in (0, 2) for r in items[f"fold{k}"]}
    assert loader.steps_per_epoch(m, "fold0+fold2", 4) == 3  # 12 records
    once = real_ids(loader.make_dataset(m, "fold0+fold2", 4, training=False, as_dict=True, repeat=False,
                                        image_size=8))
    assert sorted(once) == sorted(wanted)
    trained = loader.make_dataset(m, ["fold0", "fold2"], 4, as_dict=True, image_size=8, seed=0)
    seen = [s.decode() for batch in trained.take(30) for s in batch["source_id"].numpy()]
    assert set(seen) == wanted


def test_an_unknown_split_is_named_before_anything_else(folds):
    m, _ = folds  # its images vary in size: image_size would be the first complaint otherwise
    with pytest.raises(ManifestError, match=r"^split 'fold3' is not in this dataset; did you mean 'fold2' or "):
        loader.make_dataset(m, "fold0+fold3", 0, check_files="no")
    with pytest.raises(ValueError, match=r"^split expression 'fold0\[:50\]': 'fold0\[:50\]' reaches record 50"):
        loader.eval_steps(m, "fold0[:50]", 4)


def test_resume_on_an_expression_gives_the_steps_its_rows_are_assigned(small):
    m, ids = small
    expression, seed, batch = "train[:50%]+validation", 3, 8
    rows = ids["train"][:32] + ids["validation"]  # 31.5 rounds to 32 (to even)
    steps = [[s.decode() for s in b["source_id"].numpy()]
             for b in loader.make_dataset(m, expression, batch, seed=seed, start_step=0, as_dict=True).take(8)]
    resumed = loader.make_dataset(m, expression, batch // 2, seed=seed, start_step=5, as_dict=True,
                                  input_context=tf.distribute.InputContext(2, 1, 2))
    # pipeline 1 of 2: the second half of each global step
    for k, got in zip(range(5, 8), resumed.take(3), strict=True):
        assert [s.decode() for s in got["source_id"].numpy()] == steps[k][batch // 2:]
    for k, step in enumerate(steps):
        assert step == [rows[r] for r in epochs.batch_rows(seed, len(rows), batch, k)]
    stream = [s for step in steps for s in step]
    assert sorted(stream[:len(rows)]) == sorted(rows)  # the first epoch: each record of the expression once


def test_the_grain_source_reads_an_expression_in_order(small):
    m, _ = small
    whole = {name: RandomAccessSource(m, name) for name in m.splits}
    src = RandomAccessSource(m, "validation[2:5]+train[-2:]")
    assert len(src) == 5 and src.split == "validation[2:5]+train[-2:]"
    assert [src[i] for i in range(5)] == [whole["validation"][i] for i in (2, 3, 4)] + [whole["train"][61],
                                                                                       whole["train"][62]]
    assert src._getitems([4, 0, 4]) == [whole["train"][62], whole["validation"][2], whole["train"][62]]
