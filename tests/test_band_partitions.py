"""Band buckets moved a partition at a time (shard_utils.quality.band_partitions, beam_jobs.pipeline.near_dups):
every bucket whole in one partition, a bounded buffer, equal signatures named once, and the clusters of the
one-process reference whatever the buffers' sizes."""
from __future__ import annotations

import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from steps import counters, created, pipeline, run

from beam_jobs.pipeline.near_dups import (
    BatchMembers,
    ClusterSignatures,
    ComponentsFn,
    CutPartitions,
    cluster_of,
    in_component,
    packed,
    verify_partition,
)
from shard_utils.quality import band_partitions as bp
from shard_utils.quality import clusters as cl
from shard_utils.quality.clusters import Banding, Cluster, Member, UnionFind, find_clusters
from shard_utils.quality.member_batches import Components, batch_of, signatures_of

THRESHOLD = 10
BANDING = Banding(THRESHOLD)


def records(n: int, seed: int, flat: int = 30) -> list[tuple[int, Member]]:
    """n random signatures, a tenth with a copy 0-9 bits away, 3 look-alikes 14 bits from one prototype (a
    crowded bucket), and `flat` records of one signature (0)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = rng.getrandbits(64)
        out.append((s, Member(f"a{i:05d}", "train", (), (0, i))))
        if i % 10 == 0:
            for b in rng.sample(range(64), rng.randrange(0, 10)):
                s ^= 1 << b
            out.append((s, Member(f"b{i:05d}", "validation", (), (1, i))))
    proto = rng.getrandbits(64)
    for i in range(3):
        s = proto
        for b in rng.sample(range(64), 14):
            s ^= 1 << b
        out.append((s, Member(f"look{i}", "train", (), (3, i))))
    return out + [(0, Member(f"flat{i:02d}", "train", (), (2, i))) for i in range(flat)]


def batches(signed, size: int = 1000) -> list:
    """(packed signature or None, Member) records as batches of `size` (what a run's records are)."""
    return [batch_of(signed[start:start + size]) for start in range(0, len(signed), size)]


def sigs_of(recs) -> np.ndarray:
    return np.array([s for s, _ in recs], dtype=np.uint64)


def reduced_clusters(recs, buffer: int, cap: int = 4096) -> list[tuple[str, ...]]:
    """The clusters the partitions give: every buffer cut, each partition reduced, records joined by their
    signature's component (what ClusterSignatures does, without Beam)."""
    parts: dict[int, list] = {}
    for start in range(0, len(recs), buffer):
        for pid, part in bp.cut(BANDING, sigs_of(recs[start:start + buffer])):
            parts.setdefault(pid, []).append(part)
    forest = UnionFind()
    for pid, got in parts.items():
        for a, b in bp.reduce_partition(BANDING, pid, got, cap).edges:
            forest.union(a, b)
    groups: dict[int, list[str]] = {}
    for s, m in recs:
        node = int(np.array([s], dtype=np.uint64).view(np.int64)[0])
        if node in forest.parent:
            groups.setdefault(forest.find(node), []).append(m.source_id)
    return sorted(tuple(sorted(g)) for g in groups.values() if len(g) > 1)


def expected(recs, cap: int = 4096) -> list[tuple[str, ...]]:
    return sorted(tuple(m.source_id for m in c.members) for c in find_clusters(recs, THRESHOLD, cap))


def test_every_bucket_lies_whole_in_one_partition_with_its_band_values():
    sigs = sigs_of(records(300, 1))
    parts = bp.cut(BANDING, sigs)
    distinct, counts = np.unique(sigs, return_counts=True)
    repeated = set(distinct[counts > 1].tolist())
    assert 0 in repeated and len(repeated) > 1  # the flat signature and copies 0 bits away
    values = BANDING.band_values(distinct)
    assert [pid for pid, _ in parts] == sorted({pid for pid, _ in parts})
    assert len(parts) <= bp.partition_count(BANDING) == 272
    seen: dict[tuple[int, int], int] = {}
    for pid, (raw, vals, again) in parts:
        band, got, column = pid >> bp.PARTITION_BITS, np.frombuffer(raw, np.uint64), np.frombuffer(vals, np.uint16)
        pairs = list(zip(column.tolist(), got.tolist(), strict=True))
        assert pairs == sorted(pairs)
        assert (column >> 14 == pid & 3).all()
        assert (BANDING.band_values(got, slice(band, band + 1))[:, 0] == column).all()
        for v in column.tolist():
            assert seen.setdefault((band, v), pid) == pid
        shared = sorted(set(got.tolist()) & repeated) if band == 0 else []
        assert sorted(np.frombuffer(again, np.uint64).tolist()) == shared
    for band in range(BANDING.bands):  # each distinct signature once per band
        assert sum(len(np.frombuffer(r, np.uint64)) for p, (r, _, _) in parts if p >> 2 == band) == len(distinct)
    assert {(b, int(v)) for b in range(BANDING.bands) for v in values[:, b]} == set(seen)
    assert bp.cut(BANDING, sigs[:0]) == []


def test_the_buffer_holds_at_most_its_limit_and_cuts_what_it_held():
    """Batches of 2, 1 and 7 signatures into a buffer of 3: cut at 3, 6 and 9 (the batch of 7 in slices)."""
    buffer = bp.PartitionBuffer(BANDING, limit=3)
    sigs = sigs_of(records(8, 2, flat=0))[:10]
    emitted = [buffer.extend(sigs[:2]), buffer.extend(sigs[2:3]), buffer.extend(sigs[3:10])]
    assert emitted[0] == [] and emitted[1] == bp.cut(BANDING, sigs[:3])
    assert emitted[2] == bp.cut(BANDING, sigs[3:6]) + bp.cut(BANDING, sigs[6:9])
    assert buffer.count == 1 and buffer.flush() == bp.cut(BANDING, sigs[9:]) and buffer.flush() == []
    assert buffer.extend(sigs[:0]) == [] and buffer.count == 0
    with pytest.raises(ValueError, match="at least 1"):
        bp.PartitionBuffer(BANDING, limit=0)


@pytest.mark.parametrize(("buffer", "cap"), [(10_000, 4096), (7, 4096), (1, 4096), (53, 8)])
def test_the_partitions_give_the_reference_clusters_whatever_the_buffers(buffer, cap):
    recs = records(250, 3)
    random.Random(buffer).shuffle(recs)
    want = expected(recs, cap)
    assert len(want) > 20 and ("look0", "look1") not in want
    assert reduced_clusters(recs, buffer, cap) == want


def test_equal_signatures_are_named_once_from_band_0_and_never_compared():
    """A flat signature shared by 1,000 records, in two buffers: one self edge, no bucket of it verified."""
    flat = np.zeros(1000, dtype=np.uint64)
    parts = bp.cut(BANDING, flat[:600]) + bp.cut(BANDING, flat[600:])
    assert all(len(raw) == 8 for _, (raw, _, _) in parts)  # once per buffer and band, not 600 times
    outcomes = {pid: bp.reduce_partition(BANDING, pid, [p for q, p in parts if q == pid]) for pid, _ in parts}
    edges = [e for o in outcomes.values() for e in o.edges]
    assert edges == [(0, 0)] and sum(o.buckets_verified for o in outcomes.values()) == 0
    single = bp.cut(BANDING, np.array([5, 5, 9], dtype=np.uint64))  # repeated within one buffer only
    band0 = [(pid, p) for pid, p in single if pid >> 2 == 0]
    assert [e for pid, p in band0 for e in bp.reduce_partition(BANDING, pid, [p]).edges if e[0] == e[1]] == [(5, 5)]


def band_0_crowd(n: int = 40) -> np.ndarray:
    """n signatures equal in band 0's 16 bits, else random: one bucket of n."""
    rng = np.random.default_rng(4)
    mask = sum(1 << int(b) for b in cl._bit_orders(BANDING.permutations)[0, :16])
    return np.array([(int(r) & ~mask) | mask for r in rng.integers(0, 2**63, n, dtype=np.uint64)], dtype=np.uint64)


def test_a_hot_bucket_is_verified_in_blocks_and_counted():
    """40 signatures equal in band 0's 16 bits, else random: one bucket over a cap of 8, verified in 5 blocks."""
    sigs = band_0_crowd()
    parts = bp.cut(BANDING, sigs)
    hot = [bp.reduce_partition(BANDING, pid, [p], cap=8) for pid, p in parts if pid >> 2 == 0]
    assert [(o.buckets_verified, o.hot_buckets) for o in hot] == [(1, 1)]
    assert reduced_clusters([(int(s), Member(f"r{i}", "train")) for i, s in enumerate(sigs)], 40, cap=8) == []


def test_a_spanning_star_joins_what_a_union_find_joins_from_each_smallest_node():
    """90 random edges among 200 nodes (half above 2**63): the same components, one edge per non-root node."""
    rng = np.random.default_rng(7)
    nodes = rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)
    ends = rng.integers(0, 200, (90, 2))
    roots, members = bp.spanning_star(nodes[ends[:, 0]], nodes[ends[:, 1]])
    forest, star = UnionFind(), UnionFind()
    for x, y in nodes[ends].tolist():
        forest.union(x, y)
    for root, member in zip(roots.tolist(), members.tolist(), strict=True):
        star.union(root, member)
    assert star.groups() == forest.groups() and len(forest.groups()) > 1
    assert (roots.tolist(), members.tolist()) == ([r for r, _ in forest.edges()], [m for _, m in forest.edges()])


@pytest.mark.parametrize("crowd", [3, 40, bp.SMALL_BUCKET, bp.SMALL_BUCKET + 7])
def test_buckets_of_every_size_give_the_reference_clusters(crowd):
    """A crowd of near copies of one signature (buckets of many sizes, some over SMALL_BUCKET) among random
    ones: the reference's clusters, and its buckets counted once each."""
    rng = random.Random(crowd)
    proto = rng.getrandbits(64)
    recs = records(60, crowd, flat=0)
    for i in range(crowd):
        s = proto
        for b in rng.sample(range(64), rng.randrange(1, 8)):
            s ^= 1 << b
        recs.append((s, Member(f"c{i:03d}", "train", (), (5, i))))
    assert reduced_clusters(recs, 50) == expected(recs)
    parts = bp.cut(BANDING, sigs_of(recs))
    values = BANDING.band_values(np.unique(sigs_of(recs)))
    buckets = sum(int((np.unique(column, return_counts=True)[1] > 1).sum()) for column in values.T)
    assert sum(bp.reduce_partition(BANDING, pid, [p]).buckets_verified for pid, p in parts) == buckets


def test_small_buckets_compared_a_few_pairs_at_a_time_give_the_same_edges(monkeypatch):
    """Buckets of 2 to SMALL_BUCKET signatures, their pairs compared in blocks of about 3 pairs (a bucket's pairs
    never split): the same edges as all at once."""
    recs = records(200, 11) + [(s, m) for s, m in records(40, 12, flat=0)]
    parts = bp.cut(BANDING, sigs_of(recs))
    whole = [bp.reduce_partition(BANDING, pid, [p]).edges for pid, p in parts]
    monkeypatch.setattr(bp, "PAIRS_AT_ONCE", 3)
    assert [bp.reduce_partition(BANDING, pid, [p]).edges for pid, p in parts] == whole
    assert sum(map(len, whole)) > 30


def test_the_steps_on_beam_give_the_reference_clusters():
    """CutPartitions, verify_partition, ComponentsFn, in_component and cluster_of on FnApiRunner, each step's
    output checked."""
    recs = records(120, 5)
    signed = [(packed(s), m) for s, m in recs] + [(None, Member("unsigned", "train", (), (4, 0)))]
    want = expected(recs)
    p = pipeline()
    members = created(p, "Signed", batches(signed, 17))
    parts = members | beam.ParDo(CutPartitions(BANDING, 50))
    distinct, bands = len({s for s, _ in recs}), BANDING.bands  # each signature once per band and buffer of 50
    assert_that(parts | "Sizes" >> beam.Map(lambda part: len(part[1][0]) // 8) | beam.CombineGlobally(sum)
                | beam.Map(lambda n: n % bands == 0 and distinct * bands <= n <= (distinct + 8) * bands),
                equal_to([True]), label="EachSignatureOncePerBand")
    edges = parts | "GroupPartition" >> beam.GroupByKey() | beam.FlatMap(verify_partition, BANDING, 4096)
    components = edges | beam.CombineGlobally(ComponentsFn()).without_defaults()
    assert_that(components | "Nodes" >> beam.Map(lambda c: len(set(c.numbers.tolist())) <= len(c)),
                equal_to([True]), label="Components")
    clusters = (members | beam.FlatMap(in_component, beam.pvalue.AsSingleton(components), False)
                | "GroupCluster" >> beam.GroupByKey() | beam.FlatMapTuple(cluster_of))
    assert_that(clusters | "Ids" >> beam.Map(lambda c: tuple(m.source_id for m in c.members)), equal_to(want))
    run(p)


def test_a_partitions_edges_leave_in_lists_of_at_most_a_buffers_size():
    """60,000 signatures each shared by two records (15,000 a partition): band 0's self edges, in elements of at
    most MAX_BUFFER edges (not one element of every edge of the partition, which grows with the collection)."""
    sigs = np.arange(1, 60_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    parts = bp.cut(BANDING, np.concatenate([sigs, sigs]))
    band0 = [(pid, p) for pid, p in parts if pid >> bp.PARTITION_BITS == 0]
    lists = [edges for pid, p in band0 for edges in verify_partition((pid, [p]), BANDING, 4096)]
    assert max(len(a) for a, _ in lists) <= 8 * bp.MAX_BUFFER and all(len(a) == len(b) for a, b in lists)
    ends = [np.frombuffer(raw, dtype=np.int64) for edges in lists for raw in edges]
    assert sorted(np.concatenate(ends[::2]).tolist()) == sorted(bp.signed(sigs))
    assert all(np.array_equal(a, b) for a, b in zip(ends[::2], ends[1::2], strict=True))  # band 0: self edges


@pytest.mark.parametrize(("cap", "hot"), [(8, {"near_dup_hot_buckets": 1}), (4096, {})])
def test_the_hot_bucket_counter_is_there_only_when_a_bucket_was_hot(cap, hot):
    """A build's counters line names `near_dup_hot_buckets` when some pairs may have been missed, never as 0."""
    p = pipeline()
    created(p, "Signed", batches([(packed(int(s)), Member(f"r{i}", "train")) for i, s in enumerate(band_0_crowd())])) \
        | ClusterSignatures(THRESHOLD, cap=cap)
    got = counters(run(p))
    assert {k: v for k, v in got.items() if k == "near_dup_hot_buckets"} == hot
    assert got["near_dup_buckets_verified"] >= 1


def test_extreme_signatures_and_an_appends_records_give_the_references_clusters_ids_and_kept_members():
    """Signatures 0, 2^63 - 1, 2^63 and 2^64 - 1 (each int64 view's edge) shared across splits and with the
    dataset's records (`where` None, kept first): 0 and 2^63 are 1 bit apart across the int64 view's sign, as are
    2^63 - 1 and 2^64 - 1, so two clusters; and an empty input gives no cluster and no error."""
    recs = []
    for j, s in enumerate([0, 2**63 - 1, 2**63, 2**64 - 1]):
        recs += [(s, Member(f"n{j}{k}", ("train", "test")[k % 2], (k,), (j, k))) for k in range(2)]
        recs += [(s ^ (1 << j), Member(f"m{j}", "train", (), (j, 9))), (s, Member(f"z{j}", "train", (1,), None))]
    want = [(c.id, c.kept, c.members) for c in find_clusters(recs, THRESHOLD)]
    assert len(want) == 2 and all(kept.where is None for _, kept, _ in want)
    p = pipeline()
    found = created(p, "Signed", batches([(packed(s), m) for s, m in recs], 5)) | "Some" >> ClusterSignatures(
        THRESHOLD, buffer=3)
    assert_that(found | beam.Map(lambda c: (c.id, c.kept, c.members)), equal_to(want))
    none = created(p, "Nothing", []) | "None" >> ClusterSignatures(THRESHOLD)
    assert_that(none, equal_to([]), label="Empty")
    run(p)


def test_records_given_one_at_a_time_are_batched_within_the_limit_and_give_the_same_clusters():
    """An append's dataset records come one at a time: BatchMembers makes batches of at most its limit, signed
    records first, every record once, and they cluster as the records do."""
    recs = records(60, 9)
    signed = [(packed(s), m) for s, m in recs] + [(None, Member("unsigned", "train", (), None, "a" * 64))]
    p = pipeline()
    sig_of = {m.source_id: s for s, m in recs}
    batched = created(p, "Signed", signed) | beam.ParDo(BatchMembers(7))

    def well_formed(batch) -> bool:
        sigs, fields = batch
        n = len(sigs) // 8
        return (0 < len(fields) <= 7 and signatures_of(batch).tolist() == [sig_of[f[0]] for f in fields[:n]]
                and all(f[0] == "unsigned" for f in fields[n:]))

    assert_that(batched | "Formed" >> beam.Map(well_formed) | beam.Distinct(), equal_to([True]), label="Formed")
    assert_that(batched | "Records" >> beam.FlatMap(lambda b: b[1]) | beam.Map(lambda f: f[0]),
                equal_to([m.source_id for _, m in signed]), label="Records")
    found = batched | ClusterSignatures(THRESHOLD, buffer=20)
    assert_that(found | beam.Map(lambda c: tuple(m.source_id for m in c.members)), equal_to(expected(recs)))
    run(p)


def test_a_component_of_one_record_is_no_cluster_and_members_are_sorted():
    a, b = Member("b.jpg", "train", (), (0, 1)), Member("a.jpg", "train", (), (0, 0))
    assert list(cluster_of(0, [a])) == [] and list(cluster_of(0, [a, a])) == []
    assert list(cluster_of(0, [a, b])) == [Cluster((b, a))]
    comps = Components.of({(0, 5): 0, (1, "f" * 64): 1, (0, -1): 2})
    assert in_component(batch_of([(packed(5), a)]), comps, False) == [(0, a)]
    unsigned = Member("c.jpg", "train", (), (0, 2), "f" * 64)
    assert in_component(batch_of([(None, unsigned)]), comps, False) == []
    assert in_component(batch_of([(None, unsigned)]), comps, True) == [(1, unsigned)]
    assert in_component(batch_of([(packed(6), unsigned)]), comps, True) == [(1, unsigned)]
    assert in_component(batch_of([(packed(6), unsigned)]), comps, False) == []
    top = Member("d.jpg", "test", (1,), (3, 0), "e" * 64)  # 2^64 - 1: node -1 (its int64 view), the lowest key
    mixed = batch_of([(None, unsigned), (packed(2**64 - 1), top), (packed(4), a), (packed(5), b)])
    assert in_component(mixed, comps, True) == [(2, top), (0, b), (1, unsigned)]
    assert in_component(mixed, Components.of({}), True) == [] and len(comps) == 3


def test_the_scale_simulation_reports_the_partitions_with_the_jobs_functions():
    from benchmarks.scale_sim import near_dups as sim

    r = sim.measure(20_000)
    sizes = [r["largest_partition"][b] for b in sorted(r["largest_partition"])]
    assert sizes[0] == r["distinct"] and all(a > b for a, b in zip(sizes, sizes[1:], strict=False))
    assert r["partitions"] == 272 and r["partition_held"] >= 10 * sizes[2] // 2 and r["reduce_edges"] > 0
    assert r["merge_records"] >= r["largest_same_signature"] == 200 and r["cut_peak"] > 0


@pytest.mark.parametrize("held", [1, 7, 1 << 20])
def test_a_signature_forest_gives_the_union_finds_components_whatever_it_folds(held):
    """Random edges (self edges among them, extreme int64 nodes), given in pieces to two forests folded every
    `held` edges and merged: the same components as a union-find of the same edges, lone self-linked nodes too."""
    rng = np.random.default_rng(held)
    pool = np.concatenate([rng.integers(-2**63, 2**63 - 1, 60, dtype=np.int64), [-2**63, 2**63 - 1, 0, -1]])
    a, b = rng.choice(pool, 80), rng.choice(pool, 80)
    b[:10] = a[:10]
    a[10] = b[10] = 12345  # a node linked only to itself
    truth = UnionFind()
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        truth.union(x, y)
    one, two = bp.SignatureForest(held), bp.SignatureForest(held)
    for start in range(0, 80, 9):
        (one if start % 2 else two).add(a[start:start + 9], b[start:start + 9])
    one.merge(two)
    nodes, numbers = one.components()
    assert nodes.tolist() == sorted(truth.parent)
    got: dict[int, list[int]] = {}
    for node, number in zip(nodes.tolist(), numbers.tolist(), strict=True):
        got.setdefault(number, []).append(node)
    assert sorted(got.values()) == sorted(truth.groups(alone=True)) and sorted(got) == list(range(len(got)))
    assert bp.SignatureForest().components()[0].tolist() == []
