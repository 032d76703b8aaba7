"""Deterministic epochs as pure functions: every epoch a permutation, global batches independent of the pipelines."""
import numpy as np
import pytest

from shard_utils.read import epochs


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4097])
def test_every_epoch_is_a_permutation_and_each_a_new_order(n):
    orders = [epochs.epoch_order(seed, epoch, n) for seed in (0, 1, -3, 2**63 + 5) for epoch in (0, 1, 2)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(n))
    if n >= 7:
        assert len({tuple(o) for o in orders}) == len(orders)
    np.testing.assert_array_equal(epochs.epoch_order(5, 2, n), epochs.epoch_order(5, 2, n))  # pure


def test_positions_map_one_by_one_to_the_epoch_order():
    n = 1000
    order = epochs.epoch_order(3, 4, n)
    picked = np.array([999, 0, 500, 3])
    np.testing.assert_array_equal(epochs.permute(3, 4, n, picked), order[picked])
    with pytest.raises(ValueError, match="0..999"):
        epochs.permute(3, 4, n, np.array([1000]))


def test_the_stream_runs_through_whole_epochs_without_dropping_any_record():
    n, g = 10, 4  # 10 records, global batch 4: steps straddle epochs
    stream = np.concatenate([epochs.batch_rows(9, n, g, step) for step in range(15)])  # 60 positions = 6 epochs
    for e in range(6):
        np.testing.assert_array_equal(stream[e * n:(e + 1) * n], epochs.epoch_order(9, e, n))
    rows, eps = epochs.stream_rows(9, n, np.arange(8, 12))
    assert eps.tolist() == [0, 0, 1, 1] and rows.tolist() == stream[8:12].tolist()


@pytest.mark.parametrize("pipelines", [1, 2, 4, 8])
def test_pipelines_split_every_global_batch_the_same_way_whatever_their_count(pipelines):
    n, g = 50, 16
    for step in (0, 3, 7):
        parts = [epochs.stream_rows(1, n, epochs.share(g, pipelines, p).positions(step))[0] for p in range(pipelines)]
        np.testing.assert_array_equal(np.concatenate(parts), epochs.batch_rows(1, n, g, step))


def test_a_changed_batch_size_continues_from_the_same_example():
    n = 30
    before = np.concatenate([epochs.batch_rows(2, n, 8, s) for s in range(5)])  # 40 examples at batch 8
    after = np.concatenate([epochs.batch_rows(2, n, 6, s, origin=40) for s in range(10)])  # then batch 6
    stream = np.concatenate([before, after])
    for e in range(3):
        assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n))


def test_augmentation_seeds_are_distinct_per_epoch_and_row_and_fixed_by_the_seed():
    eps, rows = np.repeat(np.arange(3), 5), np.tile(np.arange(5), 3)
    seeds = epochs.record_seeds(4, eps, rows)
    assert seeds.shape == (15, 2) and seeds.dtype == np.int64
    assert len({tuple(s) for s in seeds}) == 15
    np.testing.assert_array_equal(seeds, epochs.record_seeds(4, eps, rows))
    assert not np.array_equal(seeds, epochs.record_seeds(5, eps, rows))


def test_bad_arguments_say_what_to_change():
    with pytest.raises(ValueError, match="does not split evenly over 3 input pipelines"):
        epochs.share(16, 3, 0)
    with pytest.raises(ValueError, match="pipeline 2 is not one of 0..1"):
        epochs.share(16, 2, 2)
    with pytest.raises(ValueError, match="num_records must be a positive int"):
        epochs.epoch_order(0, 0, 0)
