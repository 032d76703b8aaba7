"""Resumable Grain input: element k is this process's share of global step k, so Grain's own iterator state is the
step and a state saved on P processes restores on P' processes, every epoch still seen once."""
from __future__ import annotations

import grain
import pytest

from shard_utils.format.index import read_index
from shard_utils.read import epochs
from shard_utils.read.random_access import Decoder, RandomAccessSource
from shard_utils.read.resume import grain_dataset

SEED, GLOBAL = 4, 8


@pytest.fixture(scope="module")
def source(small_dataset):
    src = RandomAccessSource(str(small_dataset), "train")
    with open(small_dataset / src.manifest.split("train").index.path, "rb") as f:
        ids = [row.source_id for row in read_index(f)]
    return src, ids


def iterators(src, processes: int, state=None) -> list:
    """One Grain iterator per simulated process, each restored from `state` if given."""
    out = []
    for p in range(processes):
        ds = grain_dataset(src, seed=SEED, global_batch_size=GLOBAL, process_index=p, process_count=processes,
                           decode=Decoder.for_source(src))
        it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2)))
        if state is not None:
            it.set_state(state)
        out.append(it)
    return out


def run_steps(its, steps: int) -> list[list[str]]:
    """Source ids of each global step: the processes' shares in process order."""
    return [[s for it in its for s in next(it)["source_id"].tolist()] for _ in range(steps)]


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_each_element_is_the_process_share_of_its_global_step(source, processes):
    src, ids = source
    batch = next(iterators(src, processes)[0])
    assert batch["image"].shape == (GLOBAL // processes, 32, 32, 3) and batch["label"].shape == (GLOBAL // processes,)
    got = run_steps(iterators(src, processes), 10)  # 80 records of a 63-record epoch: steps straddle epochs
    assert got == [[ids[r] for r in epochs.batch_rows(SEED, len(ids), GLOBAL, k)] for k in range(10)]


def test_a_state_saved_on_four_processes_restores_on_two_then_one(source):
    src, ids = source
    four = iterators(src, 4)
    stream = run_steps(four, 5)
    states = [it.get_state() for it in four]
    assert states == [states[0]] * 4  # the same step on every process: the state does not depend on the process
    two = iterators(src, 2, states[0])
    stream += run_steps(two, 5)
    one = iterators(src, 1, two[0].get_state())
    stream += run_steps(one, 6)
    flat = [s for step in stream for s in step]  # 16 steps of 8 = 128 records: two epochs of 63, then two more
    assert sorted(flat[:63]) == sorted(ids) == sorted(flat[63:126])
    assert flat[:63] != flat[63:126]
    assert stream == run_steps(iterators(src, 1), 16)  # exactly the uninterrupted run
