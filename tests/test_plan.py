"""Shard planning math, without a pipeline."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_utils.errors import PlanError
from shard_utils.format.order import choose_split
from shard_utils.sharding import plan
from shard_utils.sharding.run_plan import BoundaryFinder, BucketCounts, ListingTotals, plan_exact_layouts


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


@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=50), st.integers(0, 16))
def test_buckets_preserve_hash_order(keys, bits):
    keys = sorted(keys)
    assert [plan.bucket_of(k, bits) for k in keys] == sorted(plan.bucket_of(k, bits) for k in keys)
    assert all(0 <= plan.bucket_of(k, bits) < 2**bits for k in keys)


def exact_shards(keys: list[tuple[int, str]], cores: int, bits: int, forced=None) -> list[int]:
    """Plan a split from its keys the way a reshard does (counts per bucket, then the boundary buckets' keys)."""
    totals = ListingTotals(keys=BucketCounts(bits))
    totals.add([k for k, _ in keys], [100] * len(keys))
    p = plan_exact_layouts({"train": totals}, num_cores=cores, num_hosts=1, target_shard_bytes=10**9,
                           forced=forced)["train"]
    buckets = {b: [k for k in keys if plan.bucket_of(k[0], bits) == b] for b in p.boundary_buckets}
    p = BoundaryFinder.complete(p, [pick for b, found in buckets.items() for pick in BoundaryFinder.picks(p, b, found)])
    return [p.run_of(k) for k in keys], p


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
    sizes = [p.run_size(i) for i in range(p.num_shards)]
    assert p.num_runs == p.num_shards and [owners.count(i) for i in range(p.num_shards)] == sizes
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_bucket_bits_do_not_change_the_assignment():
    import random

    rng = random.Random(5)
    keys = [(rng.getrandbits(64), f"k{i}") for i in range(1000)]
    first, _ = exact_shards(keys, 8, 0)
    assert all(exact_shards(keys, 8, bits)[0] == first for bits in (1, 4, 12, 16))


def test_exact_layouts_need_some_records_and_say_how_to_reshard():
    t = ListingTotals(keys=BucketCounts(16))
    t.add([k << 40 for k in range(16)], [10] * 16)
    with pytest.raises(PlanError, match="0 records"):
        plan_exact_layouts({}, num_cores=8, num_hosts=1, target_shard_bytes=100)
    with pytest.raises(PlanError, match="'train': 16 records cannot fill 32 shards .*reshard to fewer shards"):
        plan_exact_layouts({"train": t}, num_cores=8, num_hosts=4, target_shard_bytes=100)
    layouts = plan_exact_layouts({"train": t}, num_cores=8, num_hosts=1, target_shard_bytes=10)
    assert layouts["train"].num_shards == layouts["train"].num_runs == 16
    assert len(layouts["train"].boundary_slots) == 15 and layouts["train"].estimated_bytes == 160


def test_split_assignment_is_seeded_and_proportional():
    names = [f"x/{i}.jpg" for i in range(20000)]
    fractions = [("train", 0.9), ("validation", 0.1)]
    picks = [choose_split(fractions, 0, k) for k in names]
    assert abs(picks.count("validation") / len(picks) - 0.1) < 0.01
    assert picks == [choose_split(fractions, 0, k) for k in names]
    assert picks != [choose_split(fractions, 1, k) for k in names]
