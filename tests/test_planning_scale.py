"""Planning's per-item steps cost the same whatever the number of runs, and the scale simulator's accounting.

Cost is checked by counting: how often a layout's run starts are walked, not how long a call takes."""
from __future__ import annotations

import pickle
import random
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO

from shard_utils.errors import InternalError
from shard_utils.sharding import plan, run_plan

if str(REPO) not in sys.path:  # the simulator lives beside the package, in benchmarks/
    sys.path.insert(0, str(REPO))


class CountedSlots(tuple):
    """A layout's boundary slots that count how often they are walked."""

    walks = 0

    def __iter__(self):
        CountedSlots.walks += 1
        return super().__iter__()


def layout_of(num_runs: int, seed: int = 0) -> run_plan.SplitLayout:
    rng = random.Random(seed)
    totals = run_plan.ListingTotals()
    totals.add([rng.getrandbits(64) for _ in range(num_runs * 20)], [1000] * (num_runs * 20))
    return run_plan.plan_layout("train", totals, run_plan.SizeSample(), num_cores=1, num_hosts=1, target_shard_bytes=1,
                           forced=num_runs)


@pytest.mark.parametrize("num_runs", [10, 2000])
def test_the_boundary_check_walks_the_run_starts_once_per_layout(num_runs):
    layout = layout_of(num_runs)
    counted = replace(layout, boundary_slots=CountedSlots(layout.boundary_slots))
    CountedSlots.walks = 0
    rng = random.Random(1)
    wanted = [run_plan.BoundaryFinder.wanted(counted, rng.getrandbits(64)) for _ in range(5000)]
    assert CountedSlots.walks == 1
    assert 0 < sum(wanted) < len(wanted)
    assert counted.boundary_buckets is counted.boundary_buckets
    assert counted.boundary_buckets == {b for b, _ in layout.boundary_slots}


def test_each_bucket_picks_its_own_run_starts_without_walking_them_all():
    layout = layout_of(500)
    keys_by_bucket: dict[int, list] = {}
    rng = random.Random(2)
    for i in range(200_000):
        key = rng.getrandbits(64)
        b = plan.bucket_of(key, layout.bucket_bits)
        if b in layout.boundary_buckets:
            keys_by_bucket.setdefault(b, []).append((key, f"k{i}"))
    counted = replace(layout, boundary_slots=CountedSlots(layout.boundary_slots))
    CountedSlots.walks = 0
    for b, keys in keys_by_bucket.items():
        if len(keys) > max(p for bb, p in layout.boundary_slots if bb == b):
            picked = run_plan.BoundaryFinder.picks(counted, b, keys)
            ordered = sorted(keys)
            assert picked == [(slot, ordered[p]) for slot, (bb, p) in enumerate(layout.boundary_slots) if bb == b]
    assert CountedSlots.walks == 1


def test_what_a_layout_derives_is_not_pickled_and_is_made_again_for_a_changed_layout():
    layout = layout_of(300)
    assert layout.boundary_buckets and layout.slots_by_bucket
    copy = pickle.loads(pickle.dumps(layout))
    assert copy == layout and "boundary_buckets" not in copy.__dict__
    assert len(pickle.dumps(layout)) == len(pickle.dumps(layout_of(300)))
    fewer = replace(layout, boundary_slots=layout.boundary_slots[:1])
    assert fewer.boundary_buckets == {layout.boundary_slots[0][0]}


def test_located_ranks_agree_with_walking_the_counts():
    rng = random.Random(3)
    counts = {rng.randrange(2**16): rng.randrange(1, 50) for _ in range(3000)}
    total = sum(counts.values())
    ranks = sorted(rng.sample(range(total), 400)) + [0, total - 1]

    def walked(rank):
        acc = 0
        for bucket in sorted(counts):
            if rank < acc + counts[bucket]:
                return bucket, rank - acc
            acc += counts[bucket]

    histogram = run_plan.BucketCounts(16, np.array(sorted(counts)), np.array([counts[b] for b in sorted(counts)]))
    assert histogram.locate(ranks) == [walked(r) for r in ranks]
    with pytest.raises(InternalError):
        histogram.locate([total])


def test_a_layouts_run_sizes_one_at_a_time():
    layout = run_plan.SplitLayout("train", 1003, 0, 12, 10)
    assert [layout.run_size(i) for i in range(10)] == plan.shard_sizes(1003, 10)


def test_the_simulator_accounts_for_every_item():
    from benchmarks.scale_sim.planning import check_accounting, report, simulate

    found = simulate(20_000, sample=2_000, workers=40)
    planned = found["planned"]
    assert found["problems"] == []
    assert int(planned.run_sizes.sum()) == 20_000 and planned.run_sizes.max() - planned.run_sizes.min() <= 1
    sizes = planned.plans["train"].sizes
    assert sum(sizes) == sum(s.count for s in planned.summaries) and max(sizes) - min(sizes) <= 1
    assert set(found["per_item"]) >= {"BoundaryKeys (wanted?)", "assign to run (run_of)", "classify (listing)"}
    assert all(us > 0 for us in found["per_item"].values())
    assert found["calls"]["preflight + lock"] > 0 and found["calls"]["publish plan + clear + commit"] > 0
    assert len(report(found)) > 20
    planned.run_sizes[0] += 1  # an item counted in two runs
    assert check_accounting(planned)
