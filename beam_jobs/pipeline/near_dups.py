"""FindNearDuplicates (--near-dups): clusters of records whose perceptual signatures are a few bits apart.

    records ─► Partitions ─► GroupPartition ─► Verify ─► edges ─► Components ─► InComponent ─► GroupCluster
               (a bundle's    (one partition    (buckets of     (a spanning  ({node:        (records of a
                signatures:    of band buckets   2+ distinct     forest)      component})    component)
                numpy arrays)  per worker)       signatures)

The graph's nodes are distinct signatures: records of one signature are always in one cluster, so no record's
fields move through the band step. Records move a batch at a time (`member_batches`: a run's, or a buffer of the
dataset's records on an append): its signatures as one array, its records' fields as plain tuples. Each bundle
buffers its signatures (at most `band_partitions.MAX_BUFFER`)
and sends them as one element per partition of band buckets (`band_partitions.cut`: 10 bytes a signature and
band); a partition's reducer verifies its buckets of two or more distinct signatures (at most
`clusters.MAX_BUCKET` compared all pairs at once, more in blocks), and band 0's names the signatures more than
one record has. The connected components are computed from the edges alone, by a combiner: each worker holds
the edges it has as int64 arrays, folded into a star per component with numpy (`band_partitions.SignatureForest`)
when they grow, and one worker merges those forests. Edges are few (at most one per
signature in a cluster per band) and so is that forest: it holds the nodes in some cluster, never the others.
Iterative label propagation would spread that too, but needs as many rounds as a cluster's chain is long; a
forest merge is exact in one pass. The forest, as {node: component number} (`member_batches.Components`), is a
side input that every batch looks its signatures up in at once; only records in some cluster go on to GroupCluster
as Members. With `--dedup` a SHA-256 shared
by two or more records is a node too (GroupSameBytes), linked to their signatures. At 10^7 simulated
signatures the largest of 272 partitions held 2.5 million signatures, 25 MB (docs/near-duplicates.md,
`benchmarks/scale_sim/near_dups.py`).

ActOnClusters then says what `--near-dups` (and `--dedup`) does with each cluster (`quality.cluster_actions`):
findings, records dropped where they lie, records moved. MoveRecords copies the moved records, run by run,
into runs of their new split, which PlanShards adds after the split's own.
"""
from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.pipeline.common import count, rejected
from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.format.labels import label_order
from shard_utils.quality import band_partitions as bp
from shard_utils.quality import cluster_actions as actions
from shard_utils.quality import clusters as cl
from shard_utils.quality.clusters import Banding, Cluster, Member, UnionFind
from shard_utils.quality.member_batches import Components, MemberBatch, batch_of, member_of, signatures_of
from shard_utils.quality.signature import from_hex
from shard_utils.sharding.encode_run import EncodedRun
from shard_utils.sharding.runs import RunWriter

__all__ = ["ActOnClusters", "BatchMembers", "ClusterSignatures", "FindNearDuplicates", "MoveRecords", "member_of",
           "run_members"]

Signed = tuple  # (signature as 8 big-endian bytes or None, Member or its fields): Beam's int coder takes int64 only


def packed(signature: int) -> bytes:
    return signature.to_bytes(8, "big")


def signature_of(value) -> int | None:
    """A record's signature as an int, whether stored as one or as the index's 16 hex digits (None: unsigned)."""
    if value is None or value == "":
        return None
    return from_hex(value) if isinstance(value, str) else int(value)


class FindNearDuplicates(beam.PTransform):
    """Input: EncodedRun. Output: Cluster, one element each (two or more members). `existing` (an append):
    (packed signature or None, Member) of the dataset's records, whose `where` is None (batched here). `threshold`:
    the most differing bits of a near pair. `exact` (--dedup): records with the same bytes are joined too, signed or
    not (a distance-0 cluster)."""

    def __init__(self, threshold: int, existing=None, exact: bool = False, cap: int = cl.MAX_BUCKET):
        super().__init__()
        self.threshold, self.existing, self.exact, self.cap = threshold, existing, exact, cap

    def expand(self, runs):
        members = runs | "Members" >> beam.FlatMap(run_members, self.exact)
        if self.existing is not None:
            dataset = self.existing | "DatasetBatches" >> beam.ParDo(BatchMembers())
            members = (members, dataset) | "WithDataset" >> beam.Flatten()
        same_bytes = None
        if self.exact:
            same_bytes = (members
                          | "BySha256" >> beam.FlatMap(sha256_signatures)
                          | "GroupSameBytes" >> beam.GroupByKey()
                          | "SameBytes" >> beam.FlatMap(same_bytes_edges))
        return members | "Cluster" >> ClusterSignatures(self.threshold, self.cap, same_bytes)


class ClusterSignatures(beam.PTransform):
    """Input: MemberBatch (`member_batches`). Output: Cluster, one element each.
    `cap`: the distinct signatures of a band bucket compared all pairs at once (`clusters.verified_edges`);
    `edges`: more links between nodes (lists of (node, node): a signature's `node_of`, or a SHA-256's), which
    also bring unsigned records into clusters."""

    def __init__(self, threshold: int, cap: int = cl.MAX_BUCKET, edges=None, buffer: int = bp.MAX_BUFFER):
        super().__init__()
        self.banding, self.cap, self.edges, self.buffer = Banding(threshold), cap, edges, buffer

    def expand(self, members):
        banding = self.banding
        near = (members
                | "Partitions" >> beam.ParDo(CutPartitions(banding, self.buffer))
                | "GroupPartition" >> beam.GroupByKey()
                | "Verify" >> beam.FlatMap(verify_partition, banding, self.cap))
        more = () if self.edges is None else (self.edges,)
        components = ((near, *more)
                      | "AllEdges" >> beam.Flatten()
                      | "Components" >> beam.CombineGlobally(ComponentsFn()).without_defaults())
        return (members
                | "InComponent" >> beam.FlatMap(in_component, beam.pvalue.AsSingleton(components,
                                                                                     default_value=Components.of({})),
                                                self.edges is not None)
                | "GroupCluster" >> beam.GroupByKey()
                | "Clusters" >> beam.FlatMapTuple(cluster_of))


def run_members(encoded: EncodedRun, exact: bool = True) -> Iterable[MemberBatch]:
    """A run's records as one batch (none when the run has no file): its signatures and its records' fields, the
    record at `position` of the run being at (run, position); only the few in some cluster become Members
    (`in_component`). Without `exact` (--dedup) a record without a signature is in no cluster: a run of only such
    records (a structural check's) is not read."""
    if encoded.file is None or not (exact or encoded.tally.signed):
        return
    split, run = encoded.split, encoded.run
    signed, unsigned = [], []
    for position, entry in enumerate(encoded.file.entries()):
        meta = entry.meta
        sig = signature_of(meta.phash)
        fields = (meta.source_id, split, tuple(meta.labels), (run, position), meta.sha256)
        if sig is None:
            unsigned.append(fields)
        else:
            signed.append((sig, fields))
    yield (np.array([s for s, _ in signed], dtype=np.uint64).astype(">u8").tobytes(),
           tuple(f for _, f in signed) + tuple(unsigned))


class BatchMembers(beam.DoFn):
    """(packed signature or None, Member) -> MemberBatch of at most `limit` records: a bundle's records (the
    dataset's, on an append) buffered into batches, as a run's come."""

    def __init__(self, limit: int = bp.MAX_BUFFER):
        self.limit = limit
        self.held: list[Signed] = []

    def start_bundle(self):
        self.held = []

    def process(self, signed: Signed):
        self.held.append(signed)
        if len(self.held) >= self.limit:
            yield batch_of(self.held)
            self.held = []

    def finish_bundle(self):
        if self.held:
            yield GlobalWindows.windowed_value(batch_of(self.held))
            self.held = []


def node_of(sig: bytes) -> tuple[int, int]:
    """A signature's node in the clusters' graph: (0, its int64 value)."""
    return 0, int.from_bytes(sig, "big", signed=True)


def sha256_signatures(batch: MemberBatch) -> Iterable[tuple[str, bytes | None]]:
    """(sha256, packed signature or None) of each record of a batch (--dedup's bytes nodes)."""
    raw, fields = batch
    for i, f in enumerate(fields):
        yield f[4], raw[8 * i:8 * i + 8] or None


def same_bytes_edges(grouped) -> Iterable[list]:
    """Records of one SHA-256 (two or more): their bytes' node (1, sha256), linked to each signature's node."""
    sha256, sigs = grouped
    sigs = list(sigs)
    if len(sigs) > 1:
        node = (1, sha256)
        yield [(node, node)] + [(node, node_of(s)) for s in sorted(set(sigs) - {None})]


class CutPartitions(beam.DoFn):
    """MemberBatch -> (partition, (signatures, band values, repeated)): each bundle's signatures buffered (at most
    `limit`, a batch's at once) and cut into band partitions (`band_partitions.cut`)."""

    def __init__(self, banding: Banding, limit: int):
        self.banding, self.limit = banding, limit
        self.buffer = bp.PartitionBuffer(banding, limit)

    def start_bundle(self):
        self.buffer = bp.PartitionBuffer(self.banding, self.limit)

    def process(self, batch: MemberBatch):
        if batch[0]:
            yield from self.buffer.extend(signatures_of(batch))

    def finish_bundle(self):
        for part in self.buffer.flush():
            yield GlobalWindows.windowed_value(part)


def verify_partition(grouped, banding: Banding, cap: int) -> Iterable[tuple[bytes, bytes]]:
    """A partition's edges between signatures, as (a, b) int64 arrays' bytes of at most `band_partitions.MAX_BUFFER`
    edges (none when it has no near pairs): an element's size stays bounded however many pairs a partition holds."""
    partition, parts = grouped
    outcome = bp.reduce_partition(banding, partition, parts, cap)
    for name, n in (("near_dup_buckets_verified", outcome.buckets_verified),
                    ("near_dup_hot_buckets", outcome.hot_buckets)):
        if n:  # a counter incremented by 0 is still reported: the build's counters line would name it as 0
            count(name, n)
    for start in range(0, len(outcome.a), bp.MAX_BUFFER):
        yield outcome.a[start:start + bp.MAX_BUFFER].tobytes(), outcome.b[start:start + bp.MAX_BUFFER].tobytes()


class ComponentsFn(beam.CombineFn):
    """Edges joined into components: {node: component number} as `Components`, only the nodes in some cluster.
    Edges come as (a, b) int64 arrays' bytes between signatures (`verify_partition`), joined with numpy, or as
    lists of (node, node) with other nodes (--dedup's bytes), joined in a union-find. Each worker holds its own;
    one worker merges them."""

    def create_accumulator(self):
        return bp.SignatureForest(), UnionFind()

    def add_input(self, acc, edges):
        forest, others = acc
        if isinstance(edges, tuple):
            forest.add(np.frombuffer(edges[0], dtype=np.int64), np.frombuffer(edges[1], dtype=np.int64))
        else:
            for a, b in edges:
                others.union(a, b)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        for forest, others in accs[1:]:
            accs[0][0].merge(forest)
            accs[0][1].merge(others)
        return accs[0]

    def extract_output(self, acc) -> Components:
        forest, others = acc
        if not others.parent:
            return Components(*forest.components())
        roots, members = forest.fold()
        for a, b in zip(roots.tolist(), members.tolist(), strict=True):
            others.union((0, a), (0, b))
        return Components.of(
            {node: number for number, group in enumerate(others.groups(alone=True)) for node in group})


def in_component(batch: MemberBatch, components: Components, exact: bool) -> list[tuple[int, Member]]:
    """(component number, Member) of each record of a batch in some cluster: by its signature's node, else
    (`exact`) its bytes'."""
    return components.clustered(batch, exact)


def cluster_of(_, members: Iterable[Member]) -> Iterable[Cluster]:
    """A component's records as a Cluster, sorted by source id (none when only one record is in it)."""
    by_id: dict[str, Member] = {}
    for m in members:
        if m.source_id not in by_id or m < by_id[m.source_id]:
            by_id[m.source_id] = m
    if len(by_id) > 1:
        yield Cluster(tuple(by_id[x] for x in sorted(by_id)))


class ActOnClusters(beam.PTransform):
    """Input: Cluster. What `mode` (report, group or drop) and `dedup` do with them (`cluster_actions`). Outputs:
    `findings` (dicts for quality.jsonl), `dropped` ((split, run, position) of records left out of their run:
    rejected or moved), `rejected` (a dict per record rejected), `cross_split` ("splitA|splitB" per
    byte-identical copy rejected across splits, as --dedup counts them) and `moved` ((target split, Member))."""

    def __init__(self, mode: str, dedup: bool, labels, known_labels: tuple[str, ...] = ()):
        super().__init__()
        self.mode, self.dedup, self.labels, self.known_labels = mode, dedup, labels, tuple(known_labels)

    def expand(self, found):
        return found | "Act" >> beam.FlatMap(act, self.mode, self.dedup, self.known_labels,
                                             beam.pvalue.AsList(self.labels)) \
            .with_outputs("findings", "rejected", "cross_split", "moved", main="dropped")


def act(cluster: Cluster, mode: str, dedup: bool, known_labels: tuple[str, ...], labels: list[str]) -> Iterable:
    """A cluster's findings, then what its mode drops or moves (see ActOnClusters). A cluster of the dataset's
    records only (an append) was reported when they were built: nothing."""
    if not any(m.is_new for m in cluster.members):
        return
    count("near_dup_clusters")
    decision = actions.decide(cluster, mode, dedup)
    for finding in actions.findings(cluster, decision, label_order(labels, known_labels)):
        count(f"quality_{finding['kind']}")
        yield beam.pvalue.TaggedOutput("findings", finding)
    for m, twin, reject in decision.dropped:
        yield _placed(m)
        yield rejected(reject)
        if reject["reason"] == "duplicate" and twin.split != m.split:
            yield beam.pvalue.TaggedOutput("cross_split", "|".join(sorted((m.split, twin.split))))
    for m, target in decision.moved:
        count("near_dup_records_moved")
        yield _placed(m)
        yield beam.pvalue.TaggedOutput("moved", (target, m))


def _placed(m: Member) -> tuple[str, int, int]:
    """(split, run, position) of a record this build encoded: every member a decision drops or moves is one."""
    if m.where is None:
        raise InternalError(f"{m.source_id} is already in the dataset; a decision moves or drops only new records")
    return (m.split, *m.where)


class MoveRecords(beam.PTransform):
    """Input: EncodedRun. Output: RunFile, the records `moved` ((target split, Member)) takes out of one run into
    one split, copied byte for byte into a run of that split (in key order) under `folder`/moved. A run's moved
    records are read where the run lies: a worker holds one run's moved records at a time."""

    def __init__(self, moved, run, chunk_bytes: int):
        super().__init__()
        self.moved, self.run, self.chunk_bytes = moved, run, chunk_bytes

    def expand(self, runs):
        files = runs | "RunFiles" >> beam.FlatMap(lambda r: [((r.split, r.run), r.file)] if r.file else [])
        wanted = self.moved | "BySourceRun" >> beam.MapTuple(
            lambda target, m: ((m.split, m.where[0]), (m.where[1], target)))
        return ({"file": files, "wanted": wanted}
                | "WithRun" >> beam.CoGroupByKey()
                | "Copy" >> beam.FlatMap(copy_moved, beam.pvalue.AsSingleton(self.run), self.chunk_bytes))


def copy_moved(joined, run, chunk_bytes: int) -> Iterable:
    """The moved records of one run, a run file per target split (none when nothing moves out of the run)."""
    (split, number), found = joined
    if not found["wanted"]:
        return
    (source,) = found["file"]
    entries = source.entries()
    by_target: dict[str, list[int]] = {}
    for position, target in found["wanted"]:
        by_target.setdefault(target, []).append(position)
    for target, positions in sorted(by_target.items()):
        writer = RunWriter(storage.join(run.temp_dir, "moved", split), target, number, chunk_bytes)
        try:
            for position in sorted(set(positions)):
                start = entries[position - 1].end if position else 0
                writer.add(source.read(start, entries[position].end), entries[position].meta)
            written = writer.close()
        except BaseException:
            writer.abort()
            raise
        if written is not None:
            yield written
