"""Shard planning math, without a pipeline."""
import pytest
from hypothesis import given, strategies as st

from shard_utils import plan


@given(st.integers(1, 10**7), st.integers(1, 512))
def test_shard_sizes_differ_by_at_most_one_and_sum(n, count):
    sizes = plan.shard_sizes(n, count)
    assert len(sizes) == count and sum(sizes) == n and max(sizes) - min(sizes) <= 1


@given(st.integers(8, 10**6), st.integers(0, 10**12), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
       st.integers(1, 10**9))
def test_num_shards_is_a_multiple_of_cores_and_never_empty(n, size, cores, hosts, target):
    unit = cores * hosts
    if n < unit:
        with pytest.raises(plan.PlanError, match="cannot fill"):
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
    with pytest.raises(plan.PlanError, match="multiple"):
        plan.num_shards(100, 1, forced=12)
    with pytest.raises(plan.PlanError, match="empty"):
        plan.num_shards(10, 1, forced=16)


@given(st.integers(1, 5000), st.integers(1, 64))
def test_rank_to_shard_matches_sizes(n, count):
    if count > n:
        return
    starts = plan.shard_starts(n, count)
    owners = [plan.shard_of_rank(r, starts) for r in range(n)]
    assert owners == sorted(owners)
    assert [owners.count(i) for i in range(count)] == plan.shard_sizes(n, count)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=50), st.integers(1, 1000))
def test_buckets_preserve_hash_order(keys, buckets):
    keys = sorted(keys)
    assert [plan.bucket_of(k, buckets) for k in keys] == sorted(plan.bucket_of(k, buckets) for k in keys)
    assert all(0 <= plan.bucket_of(k, buckets) < buckets for k in keys)


def test_split_assignment_is_seeded_and_proportional():
    names = [f"x/{i}.jpg" for i in range(20000)]
    fractions = [("train", 0.9), ("validation", 0.1)]
    picks = [plan.choose_split(fractions, 0, k) for k in names]
    assert abs(picks.count("validation") / len(picks) - 0.1) < 0.01
    assert picks == [plan.choose_split(fractions, 0, k) for k in names]
    assert picks != [plan.choose_split(fractions, 1, k) for k in names]
