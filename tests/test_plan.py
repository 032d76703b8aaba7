"""Shard planning math, without a pipeline."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_utils.errors import PlanError
from shard_utils.format.order import choose_split
from shard_utils.sharding import plan


@given(st.integers(1, 10**7), st.integers(1, 512))
def test_shard_sizes_differ_by_at_most_one_and_sum(n, count):
    sizes = plan.shard_sizes(n, count)
    assert len(sizes) == count and sum(sizes) == n and max(sizes) - min(sizes) <= 1


@given(st.integers(8, 10**6), st.integers(0, 10**12), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
       st.integers(1, 10**9))
def test_num_shards_is_a_multiple_of_cores_and_never_empty(n, size, cores, hosts, target):
    unit = cores * hosts
    if n < unit:
        with pytest.raises(PlanError, match="cannot fill"):
            plan.num_shards(n, size, num_cores=cores, num_hosts=hosts, target_shard_bytes=target)
        return
    count = plan.num_shards(n, size, num_cores=cores, num_hosts=hosts, target_shard_bytes=target)
    assert count % unit == 0 and unit <= count <= n


def test_num_shards_follows_target_size():
    assert plan.num_shards(10_000, 1_000 * plan.MB, target_shard_bytes=128 * plan.MB) == 8
    assert plan.num_shards(10_000, 4_000 * plan.MB, target_shard_bytes=128 * plan.MB) == 32
    assert plan.num_shards(100, 1 * plan.MB) == 8  # tiny still gets num_cores shards


def test_forced_shards_checked():
    assert plan.num_shards(100, 1, forced=16) == 16
    with pytest.raises(PlanError, match="multiple"):
        plan.num_shards(100, 1, forced=12)
    with pytest.raises(PlanError, match="empty"):
        plan.num_shards(10, 1, forced=16)


@given(st.integers(1, 5000), st.integers(1, 64))
def test_rank_to_shard_matches_sizes(n, count):
    if count > n:
        return
    starts = plan.shard_starts(n, count)
    owners = [plan.shard_of_rank(r, starts) for r in range(n)]
    assert owners == sorted(owners)
    assert [owners.count(i) for i in range(count)] == plan.shard_sizes(n, count)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=50), st.integers(0, 16))
def test_buckets_preserve_hash_order(keys, bits):
    keys = sorted(keys)
    assert [plan.bucket_of(k, bits) for k in keys] == sorted(plan.bucket_of(k, bits) for k in keys)
    assert all(0 <= plan.bucket_of(k, bits) < 2**bits for k in keys)


def exact_shards(keys: list[tuple[int, str]], cores: int, bits: int, forced=None) -> list[int]:
    """Plan a split from its keys the way the job does (counts per bucket, then the boundary buckets' keys)."""
    totals = plan.SplitTotals()
    for k, _ in keys:
        totals.add(k, 100, bits)
    p = plan.plan_split("train", totals, num_cores=cores, num_hosts=1, target_shard_bytes=10**9, forced=forced,
                        bucket_bits=bits)
    buckets = {b: sorted(k for k in keys if plan.bucket_of(k[0], bits) == b) for b in p.boundary_buckets}
    p = p.with_boundaries(buckets)
    return [p.shard_of(k) for k in keys], p


@pytest.mark.slow
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.text(max_size=3)), min_size=8, max_size=300, unique=True),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 1, 2, 8, 16]), st.booleans())
def test_boundaries_give_exact_balance_in_key_order(keys, cores, bits, collide):
    if collide:  # many records sharing a 64-bit hash: the key's text breaks the tie
        keys = sorted({(k % 3, t) for k, t in keys})
        if len(keys) < cores:
            return
    owners, p = exact_shards(keys, cores, bits)
    by_order = [owner for _, owner in sorted(zip(keys, owners, strict=True))]
    assert by_order == sorted(by_order)  # contiguous runs of the total order
    assert [owners.count(i) for i in range(p.num_shards)] == p.sizes
    assert max(p.sizes) - min(p.sizes) <= 1 and min(p.sizes) >= 1


def test_bucket_bits_do_not_change_the_assignment():
    import random

    rng = random.Random(5)
    keys = [(rng.getrandbits(64), f"k{i}") for i in range(1000)]
    first, _ = exact_shards(keys, 8, 0)
    assert all(exact_shards(keys, 8, bits)[0] == first for bits in (1, 4, 12, 16))


def test_a_rank_beyond_the_counts_is_an_error():
    with pytest.raises(PlanError):
        plan.locate_rank(10, {0: 4, 3: 5})
    assert plan.locate_rank(4, {0: 4, 3: 5}) == (3, 0)


def test_plans_need_every_named_split_and_some_records():
    t = plan.SplitTotals()
    for k in range(16):
        t.add(k << 40, 10, 16)
    with pytest.raises(PlanError, match="0 records"):
        plan.plan_splits({}, expected_splits=["train"], num_cores=8, num_hosts=1, target_shard_bytes=100)
    with pytest.raises(PlanError, match="'validation' received no records"):
        plan.plan_splits({"train": t}, expected_splits=["train", "validation"], num_cores=8, num_hosts=1,
                         target_shard_bytes=100)
    plans = plan.plan_splits({"train": t}, expected_splits=["train"], num_cores=8, num_hosts=1,
                             target_shard_bytes=10)
    assert plans["train"].num_shards == 16 and len(plans["train"].boundary_slots) == 15


def test_split_assignment_is_seeded_and_proportional():
    names = [f"x/{i}.jpg" for i in range(20000)]
    fractions = [("train", 0.9), ("validation", 0.1)]
    picks = [choose_split(fractions, 0, k) for k in names]
    assert abs(picks.count("validation") / len(picks) - 0.1) < 0.01
    assert picks == [choose_split(fractions, 0, k) for k in names]
    assert picks != [choose_split(fractions, 1, k) for k in names]
