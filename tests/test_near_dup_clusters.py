"""Near-duplicate clusters from signatures (shard_utils.quality.clusters): the band maths, and clusters that are
sound (every member joined by near pairs), complete where the bands promise it, and free of input order."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_utils.quality import clusters as cl
from shard_utils.quality.clusters import Banding, Member, UnionFind, band_recall, find_clusters, permutations_for

THRESHOLD = 10


def flipped(sig: int, bits) -> int:
    for b in bits:
        sig ^= 1 << int(b)
    return sig


def distance(a: int, b: int) -> int:
    return (a ^ b).bit_count()


@pytest.mark.parametrize("threshold", [4, 6, 8, 10, 12])
def test_the_fewest_permutations_that_reach_the_target_recall(threshold):
    p = permutations_for(threshold)
    assert band_recall(threshold, p) >= cl.TARGET_RECALL
    assert p == 1 or band_recall(threshold, p - 1) < cl.TARGET_RECALL
    assert all(band_recall(d, p) >= band_recall(threshold, p) for d in range(threshold))  # closer: found more


def test_out_of_range_thresholds_are_refused_in_one_line():
    for bad in (-1, 32, 40):
        with pytest.raises(ValueError, match="threshold"):
            permutations_for(bad)


@pytest.mark.parametrize("d", [3, 8, 10, 12])
def test_measured_recall_matches_the_formula(d):
    """Pairs d bits apart at random positions: the share sharing a band key is the formula's, within sampling."""
    banding, rng, n = Banding(THRESHOLD), np.random.default_rng(d), 3000
    a = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    b = np.array([flipped(int(x), rng.choice(64, d, replace=False)) for x in a], dtype=np.uint64)
    found = (banding.band_values(a) == banding.band_values(b)).any(axis=1).mean()
    expected = banding.recall(d)
    assert abs(found - expected) <= 4 * np.sqrt(expected * (1 - expected) / n) + 1e-9
    if d <= 3:
        assert found == 1.0  # pigeonhole: 4 disjoint bands, 3 flips


def brute_force_forest(records, threshold):
    forest = UnionFind()
    for i, (s, m) in enumerate(records):
        for t, o in records[i + 1:]:
            if distance(s, t) <= threshold:
                forest.union(m.source_id, o.source_id)
    return forest


signatures = st.integers(0, 2**64 - 1)
families = st.lists(st.tuples(signatures, st.lists(st.lists(st.integers(0, 63), max_size=3), max_size=3)),
                    min_size=1, max_size=12)


def records_of(fams) -> list[tuple[int, Member]]:
    """Each family: a signature and copies of it with up to 3 bits flipped (pairs the bands must find)."""
    out = []
    for f, (sig, copies) in enumerate(fams):
        out.append((sig, Member(f"f{f:02d}-0", "train", (f % 2,), (0, len(out)))))
        for c, bits in enumerate(copies):
            out.append((flipped(sig, set(bits)), Member(f"f{f:02d}-{c + 1}", "validation", (0,), (1, len(out)))))
    return out


@settings(max_examples=40, deadline=None)
@given(families, st.randoms(use_true_random=False), st.integers(2, 5))
def test_clusters_are_sound_complete_within_three_bits_and_order_free(fams, rnd, cap):
    records = records_of(fams)
    found = find_clusters(records, THRESHOLD)
    truth = brute_force_forest(records, THRESHOLD)
    sig_of = {m.source_id: s for s, m in records}
    for c in found:  # sound: each cluster is one component of the near-pair graph
        roots = {truth.find(m.source_id) for m in c.members}
        assert len(roots) == 1
        assert c.kept.source_id == min(m.source_id for m in c.members)
    close = UnionFind()  # complete: pairs 0-3 bits apart are always found
    for i, (s, m) in enumerate(records):
        for t, o in records[i + 1:]:
            if distance(s, t) <= 3:
                close.union(m.source_id, o.source_id)
    clustered = {m.source_id: c.id for c in found for m in c.members}
    for a, b in close.edges():
        assert a in clustered and clustered[a] == clustered.get(b), (a, b, bin(sig_of[a] ^ sig_of[b]))
    shuffled = list(records)
    rnd.shuffle(shuffled)
    assert [(c.id, c.members) for c in find_clusters(shuffled, THRESHOLD)] == [(c.id, c.members) for c in found]
    for c in find_clusters(shuffled, THRESHOLD, cap=cap):  # hot buckets cut in blocks: still sound
        assert len({truth.find(m.source_id) for m in c.members}) == 1


def test_a_flat_signature_shared_by_thousands_is_one_cluster_without_all_pairs():
    records = [(0, Member(f"flat{i:05d}", "train", (), (0, i))) for i in range(3000)]
    records += [(1, Member("almost", "train", (), (1, 0)))]
    found = find_clusters(records, THRESHOLD, cap=16)
    assert len(found) == 1 and len(found[0].members) == 3001
    assert found[0].kept.source_id == "almost"


def test_the_datasets_own_record_is_kept_and_ids_follow_the_kept_member():
    old = Member("zzz", "validation", (1,), None)
    new = Member("aaa", "train", (2,), (0, 0))
    (c,) = find_clusters([(5, new), (5 ^ 0b111, old)], THRESHOLD)
    assert c.kept == old and c.others == (new,)
    assert c.splits == ("train", "validation") and c.labels == ((1,), (2,))
    (alone,) = find_clusters([(5, Member("zzz", "train", (1,), (0, 1))), (5 ^ 0b111, new)], THRESHOLD)
    assert alone.id != c.id and alone.kept.source_id == "aaa"


def test_far_signatures_make_no_cluster():
    rng = random.Random(3)
    records = [(rng.getrandbits(64), Member(f"r{i}", "train")) for i in range(500)]
    truth = brute_force_forest(records, THRESHOLD)
    assert [sorted(m.source_id for m in c.members) for c in find_clusters(records, THRESHOLD)] == truth.groups()


def test_grouped_clusters_keep_the_splits_near_their_fractions():
    """--near-dups group: a cluster goes where its kept member's own hash put it, so each split keeps its fraction
    in expectation; with clusters of 2-4 records (a third of 20,000 records) the shares stay within 1 %."""
    from shard_utils.format.order import choose_split
    from shard_utils.quality.cluster_actions import decide
    from shard_utils.quality.clusters import Cluster

    fractions, rng = [("train", 0.8), ("validation", 0.1), ("test", 0.1)], random.Random(5)
    ids = [f"img{i:06d}.jpg" for i in range(20_000)]
    members = [Member(i, choose_split(fractions, 0, i), (0,), (0, n)) for n, i in enumerate(ids)]
    clusters, at = [], 0
    while at < len(members) // 3:
        size = rng.randint(2, 4)
        clusters.append(Cluster(tuple(members[at:at + size])))
        at += size
    final = {m.source_id: m.split for m in members}
    for c in clusters:
        for m, target in decide(c, "group").moved:
            final[m.source_id] = target
        assert len({final[m.source_id] for m in c.members}) == 1
    for name, fraction in fractions:
        share = sum(s == name for s in final.values()) / len(final)
        assert abs(share - fraction) < 0.01, (name, share)


def test_dedup_rejects_byte_copies_and_group_moves_the_rest_into_the_kept_split():
    from shard_utils.quality.cluster_actions import decide
    from shard_utils.quality.clusters import Cluster

    kept = Member("a.jpg", "train", (0,), (0, 0), "s1")
    copy = Member("b.jpg", "validation", (0,), (1, 0), "s1")  # same bytes as a.jpg
    near = Member("c.jpg", "test", (1,), (2, 0), "s2")
    twin = Member("d.jpg", "test", (1,), (2, 1), "s2")  # same bytes as c.jpg, not as the kept one
    cluster = Cluster((kept, copy, near, twin))
    grouped = decide(cluster, "group", dedup=True)
    assert [(m.source_id, named.source_id, r["reason"]) for m, named, r in grouped.dropped] == [
        ("b.jpg", "a.jpg", "duplicate"), ("d.jpg", "c.jpg", "duplicate")]
    assert [(m.source_id, target) for m, target in grouped.moved] == [("c.jpg", "train")]
    dropped = decide(cluster, "drop")
    assert [(m.source_id, r["reason"]) for m, _, r in dropped.dropped] == [
        ("b.jpg", "duplicate"), ("c.jpg", "near_duplicate"), ("d.jpg", "near_duplicate")]
    assert all("of a.jpg (kept, in split train)" in r["message"] or "as a.jpg" in r["message"]
               for _, _, r in dropped.dropped)
    assert decide(cluster, "report") == decide(cluster, "report", dedup=False) and not decide(cluster, "report").moved
    with pytest.raises(ValueError, match="--near-dups 'merge'"):
        decide(cluster, "merge")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=cl.FEW + 1), st.data())
def test_a_few_signatures_make_the_same_pairs_in_plain_ints_as_in_numpy(sigs, data):
    near = [s ^ (1 << data.draw(st.integers(0, 63))) for s in sigs[:4]]  # some pairs within the threshold
    sigs = (sigs + near)[:cl.FEW]
    assert list(cl._near_pairs_few(sigs, 10)) == list(cl._near_pairs(np.array(sigs, dtype=np.uint64), 10))
