"""The pure planning of runs and shards (shard_utils.sharding): balance, coverage and determinism."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_utils.errors import InternalError, PlanError
from shard_utils.format.order import sort_key
from shard_utils.sharding import plan, run_plan
from shard_utils.sharding.shards import RunCount, plan_split_shards


def keys_of(n: int, seed: int = 0) -> list[tuple[int, str]]:
    return [(sort_key(seed, f"img{i}.jpg"), f"img{i}.jpg") for i in range(n)]


def totals_of(keys, bits: int, sizes=None) -> run_plan.ListingTotals:
    t = run_plan.ListingTotals(keys=run_plan.BucketCounts(bits))
    t.add([k for k, _ in keys], sizes or [0] * len(keys))
    return t


def find_boundaries(layout: run_plan.SplitLayout, keys) -> run_plan.SplitLayout:
    by_bucket: dict[int, list] = {}
    for k in keys:
        if run_plan.BoundaryFinder.wanted(layout, k[0]):
            by_bucket.setdefault(run_plan.bucket_of(k[0], layout.bucket_bits), []).append(k)
    picked = [p for b, ks in by_bucket.items() for p in run_plan.BoundaryFinder.picks(layout, b, ks)]
    return run_plan.BoundaryFinder.complete(layout, picked)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(8, 3000), bits=st.sampled_from([0, 1, 4, 16]), cores=st.sampled_from([1, 2, 8]),
       target=st.integers(1, 50), seed=st.integers(0, 5))
def test_runs_are_equal_contiguous_ranges_of_the_key_order(n, bits, cores, target, seed):
    keys = keys_of(n, seed)
    if n < cores:
        return
    layout = run_plan.plan_layout("train", totals_of(keys, bits), run_plan.SizeSample(), num_cores=cores, num_hosts=1,
                             target_shard_bytes=target * 100_000)
    assert layout.num_shards % cores == 0 and 1 <= layout.num_runs <= layout.num_shards <= n
    layout = find_boundaries(layout, keys)
    runs: dict[int, list] = {}
    for k in keys:
        runs.setdefault(layout.run_of(k), []).append(k)
    assert sorted(runs) == list(range(layout.num_runs))
    assert max(map(len, runs.values())) - min(map(len, runs.values())) <= 1
    ordered = sorted(keys)
    at = 0
    for r in range(layout.num_runs):  # each run is the next contiguous range of the order
        assert sorted(runs[r]) == ordered[at:at + len(runs[r])]
        at += len(runs[r])


def test_the_estimate_scales_file_sizes_by_the_sample():
    keys = keys_of(1000)
    totals = totals_of(keys, 16, sizes=[1_000_000] * 1000)  # 1 GB of 1 MB photos
    small = run_plan.SizeSample(source_bytes=32_000_000, record_bytes=640_000, records=32)  # 20 KB records
    assert run_plan.estimated_bytes(totals, small) == 20_000_000
    layout = run_plan.plan_layout("train", totals, small, num_cores=8, num_hosts=1, target_shard_bytes=2_500_000)
    assert layout.num_shards == 8  # 20 MB / 2.5 MB
    unsized = totals_of(keys, 16)
    assert run_plan.estimated_bytes(unsized, small) == 1000 * 20_000
    assert run_plan.estimated_bytes(unsized, run_plan.SizeSample()) == \
        1000 * (run_plan.UNSIZED_GUESS + run_plan.RECORD_OVERHEAD)


def test_spill_shards_only_when_a_split_has_sixteen_shards_or_more():
    assert [run_plan.spill_shards(s) for s in (8, 15, 16, 32, 11_700)] == [0, 0, 1, 2, 731]


def check_split(shards, counts: list[RunCount], unit: int):
    sizes = shards.sizes
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1 and len(sizes) % unit == 0
    seen: dict[int, set] = {}
    for s in shards.shards:
        for p in s.pieces:
            got = seen.setdefault(p.run, set())
            new = set(range(p.first, p.first + p.count))
            assert not got & new  # no record twice
            got |= new
        if s.prefix:
            assert len(s.pieces) == 1 and s.pieces[0].run == s.shard and s.pieces[0].first == 0
    for r in counts:  # every usable record once
        assert seen.get(r.run, set()) == set(range(r.records))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_usable_record_lands_once_and_shards_are_balanced(data):
    unit = data.draw(st.sampled_from([1, 2, 8]))
    shards = unit * data.draw(st.integers(1, 6))
    runs = shards - run_plan.spill_shards(shards)
    listed = data.draw(st.integers(shards, shards * 40))
    per_run = plan.shard_sizes(listed, runs)
    counts = [RunCount(r, max(0, n - data.draw(st.integers(0, n)) if data.draw(st.booleans()) else n))
              for r, n in enumerate(per_run)]
    layout = run_plan.SplitLayout("train", listed, 0, shards, runs)
    if sum(c.records for c in counts) < unit:
        with pytest.raises(PlanError, match="cannot fill"):
            plan_split_shards(layout, counts, num_cores=unit, num_hosts=1)
        return
    out = plan_split_shards(layout, counts, num_cores=unit, num_hosts=1)
    check_split(out, counts, unit)
    assert out.num_shards <= shards


def test_without_rejects_every_core_shard_is_a_prefix_and_only_spill_shards_are_copied():
    shards, unit = 64, 8
    runs = shards - run_plan.spill_shards(shards)
    listed = 64 * 850
    counts = [RunCount(r, n) for r, n in enumerate(plan.shard_sizes(listed, runs))]
    out = plan_split_shards(run_plan.SplitLayout("train", listed, 0, shards, runs), counts, num_cores=unit, num_hosts=1)
    check_split(out, counts, unit)
    assert [s.prefix for s in out.shards] == [True] * runs + [False] * (shards - runs)
    assert sum(s.num_records for s in out.shards if not s.prefix) / listed == pytest.approx(4 / 64, abs=0.01)


def test_with_one_percent_rejects_spread_by_hash_almost_every_core_shard_stays_a_prefix():
    rng = random.Random(3)
    shards, unit = 1024, 8
    runs = shards - run_plan.spill_shards(shards)
    listed = shards * 850
    counts = [RunCount(r, n - sum(rng.random() < 0.01 for _ in range(n)))
              for r, n in enumerate(plan.shard_sizes(listed, runs))]
    out = plan_split_shards(run_plan.SplitLayout("train", listed, 0, shards, runs), counts, num_cores=unit, num_hosts=1)
    check_split(out, counts, unit)
    copied = sum(s.num_records for s in out.shards if not s.prefix) / out.num_records
    assert sum(s.prefix for s in out.shards) == runs
    assert copied < 0.08


def test_too_many_rejects_lower_the_shard_count_or_fail_in_one_line():
    layout = run_plan.SplitLayout("train", 80, 0, 16, 15)
    counts = [RunCount(r, 2) for r in range(15)]  # 30 usable records still fill the 16 shards
    out = plan_split_shards(layout, counts, num_cores=8, num_hosts=1)
    assert out.num_shards == 16
    counts = [RunCount(r, 1) for r in range(15)]  # 15 records: one shard per core is 8
    assert plan_split_shards(layout, counts, num_cores=8, num_hosts=1).num_shards == 8
    with pytest.raises(PlanError, match="7 records cannot fill 8 shards"):
        plan_split_shards(layout, [RunCount(r, int(r < 7)) for r in range(15)], num_cores=8, num_hosts=1)
    with pytest.raises(PlanError, match="--num-shards 16 is more than its 15 records"):
        plan_split_shards(layout, counts, num_cores=8, num_hosts=1, forced=16)


def test_a_dropped_record_inside_a_prefix_makes_that_shard_a_copy():
    layout = run_plan.SplitLayout("train", 16, 0, 2, 2)
    counts = [RunCount(0, 7, first_dropped=3), RunCount(1, 8)]
    out = plan_split_shards(layout, counts, num_cores=2, num_hosts=1)
    check_split(out, counts, 2)
    assert [s.prefix for s in out.shards] == [False, True]  # shard 0 also takes run 1's last record
    counts = [RunCount(0, 8, first_dropped=8), RunCount(1, 8)]  # dropped after the prefix
    assert [s.prefix for s in plan_split_shards(layout, counts, num_cores=2, num_hosts=1).shards] == [True, True]


def test_missing_runs_are_an_internal_error():
    with pytest.raises(InternalError, match="expected runs 0..2"):
        plan_split_shards(run_plan.SplitLayout("train", 30, 0, 3, 3), [RunCount(0, 10), RunCount(2, 10)],
                          num_cores=1, num_hosts=1)
