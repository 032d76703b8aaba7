"""FindNearDuplicates (--near-dups): clusters of records whose perceptual signatures are a few bits apart.

    records ─► GroupSameSignature ─► band keys ─► GroupBand ─► verify pairs ─► edges ─► Components ─► clusters
               (equal signatures:     (68 per     (one bucket   (full Hamming   (a spanning
                one representative)    signature)  per worker)   distance)       forest each)

No worker holds every signature: a band bucket holds the distinct signatures that share one band's 16 bits
(at most `clusters.MAX_BUCKET` are compared all pairs at once, more in blocks), and a group of equal
signatures is read twice as it streams (its smallest member, then an edge to each other), never gathered.
The connected components are computed from the edges alone, by a combiner: each worker joins the edges it
has into a union-find, and one worker merges those forests. Edges are few (at most one per record in a
cluster per band, after each bucket is reduced to a spanning forest) and so is that forest: it holds the
records that are in some cluster, never the others. Iterative label propagation would spread that too, but
needs as many rounds as a cluster's chain is long; a forest merge is exact in one pass. At 10^7 simulated
signatures the largest band bucket held 219 (docs/near-duplicates.md, `benchmarks/scale_sim/near_dups.py`).

ActOnClusters then says what `--near-dups` (and `--dedup`) does with each cluster (`quality.cluster_actions`):
findings, records dropped where they lie, records moved. MoveRecords copies the moved records, run by run,
into runs of their new split, which PlanShards adds after the split's own.
"""
from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam

from beam_jobs.pipeline.common import count, rejected
from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.format.labels import label_order
from shard_utils.quality import cluster_actions as actions
from shard_utils.quality import clusters as cl
from shard_utils.quality.clusters import Banding, Cluster, Member, UnionFind
from shard_utils.quality.signature import from_hex
from shard_utils.sharding.encode_run import EncodedRun
from shard_utils.sharding.runs import RunWriter

__all__ = ["ActOnClusters", "ClusterSignatures", "FindNearDuplicates", "MoveRecords", "run_members"]

Signed = tuple  # (signature as 8 big-endian bytes, Member): Beam's int coder takes signed 64-bit values only


def packed(signature: int) -> bytes:
    return signature.to_bytes(8, "big")


def unpacked(signature: bytes) -> int:
    return int.from_bytes(signature, "big")


def signature_of(value) -> int | None:
    """A record's signature as an int, whether stored as one or as the index's 16 hex digits (None: unsigned)."""
    if value is None or value == "":
        return None
    return from_hex(value) if isinstance(value, str) else int(value)


class FindNearDuplicates(beam.PTransform):
    """Input: EncodedRun. Output: Cluster, one element each (two or more members). `existing` (an append):
    (packed signature or None, Member) of the dataset's records, whose `where` is None. `threshold`: the most
    differing bits of a near pair. `exact` (--dedup): records with the same bytes are joined too, signed or
    not (a distance-0 cluster)."""

    def __init__(self, threshold: int, existing=None, exact: bool = False, cap: int = cl.MAX_BUCKET):
        super().__init__()
        self.threshold, self.existing, self.exact, self.cap = threshold, existing, exact, cap

    def expand(self, runs):
        members = runs | "Members" >> beam.FlatMap(run_members)
        if self.existing is not None:
            members = (members, self.existing) | "WithDataset" >> beam.Flatten()
        signed = members | "Signed" >> beam.Filter(lambda sm: sm[0] is not None)
        same_bytes = None
        if self.exact:
            same_bytes = (members
                          | "BySha256" >> beam.Map(lambda sm: (sm[1].sha256, sm[1]))
                          | "GroupSameBytes" >> beam.GroupByKey()
                          | "SameBytes" >> beam.FlatMap(collapse).with_outputs("edges", main="first")).edges
        return signed | "Cluster" >> ClusterSignatures(self.threshold, self.cap, same_bytes)


class ClusterSignatures(beam.PTransform):
    """Input: (packed signature, Member). Output: Cluster, one element each. `cap`: the distinct signatures of a
    band bucket compared all pairs at once (`clusters.verified_edges`); `edges`: more (Member, Member) links."""

    def __init__(self, threshold: int, cap: int = cl.MAX_BUCKET, edges=None):
        super().__init__()
        self.banding, self.cap, self.edges = Banding(threshold), cap, edges

    def expand(self, signed):
        banding, cap = self.banding, self.cap
        same = (signed
                | "GroupSameSignature" >> beam.GroupByKey()
                | "Collapse" >> beam.FlatMap(collapse).with_outputs("edges", main="distinct"))
        near = (same.distinct
                | "BandKeys" >> beam.FlatMap(band_keys, banding)
                | "GroupBand" >> beam.GroupByKey()
                | "Verify" >> beam.FlatMap(verify_bucket, banding.threshold, cap))
        more = () if self.edges is None else (self.edges,)
        return ((same.edges, near, *more)
                | "AllEdges" >> beam.Flatten()
                | "Components" >> beam.CombineGlobally(ComponentsFn()).without_defaults()
                | "Clusters" >> beam.FlatMap(lambda found: found))


def run_members(encoded: EncodedRun) -> Iterable[Signed]:
    """(packed signature or None, Member) of every record of a run."""
    if encoded.file is None:
        return
    for position, entry in enumerate(encoded.file.entries()):
        meta = entry.meta
        sig = signature_of(meta.phash)
        yield (None if sig is None else packed(sig),
               Member(meta.source_id, encoded.split, tuple(meta.labels), (encoded.run, position), meta.sha256))


def collapse(grouped) -> Iterable:
    """Records of one signature: the first member (by Member order) goes on to the bands; each other is joined
    to it by an edge (tagged `edges`). The group is read twice as it streams, never held."""
    sig, members = grouped
    first = min(members)
    yield sig, first
    for m in members:
        if m != first:
            yield beam.pvalue.TaggedOutput("edges", (first, m))


def band_keys(signed: Signed, banding: Banding) -> list[tuple[int, tuple]]:
    """(band key, (packed signature, the member's fields)) for each band: plain ints, bytes and tuples, which
    Beam's coder writes natively (a Member would be pickled once per band)."""
    sig, m = signed
    fields = (m.source_id, m.split, m.labels, m.where, m.sha256)
    value = (sig, fields)
    return [(key, value) for key in banding.keys(unpacked(sig))]


def verify_bucket(grouped, threshold: int, cap: int) -> Iterable[tuple[Member, Member]]:
    """The near pairs of one band bucket (of `band_keys` values), as a spanning forest: (member, member) edges."""
    _, signed = grouped
    members = {fields[0]: (sig, fields) for sig, fields in signed}
    if len(members) < 2:
        return
    count("near_dup_buckets_verified")
    outcome = cl.verified_edges(((unpacked(sig), source_id) for source_id, (sig, _) in members.items()),
                                threshold, cap)
    if outcome.blocks > 1:
        count("near_dup_hot_buckets")
    for a, b in outcome.edges:
        yield Member(*members[a][1]), Member(*members[b][1])


class ComponentsFn(beam.CombineFn):
    """Edges joined into clusters: each accumulator a union-find over source ids and the members it saw."""

    def create_accumulator(self):
        return UnionFind(), {}

    def add_input(self, acc, edge: tuple[Member, Member]):
        forest, members = acc
        a, b = edge
        members[a.source_id], members[b.source_id] = a, b
        forest.union(a.source_id, b.source_id)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        forest, members = accs[0]
        for other_forest, other_members in accs[1:]:
            forest.merge(other_forest)
            members.update(other_members)
        return forest, members

    def extract_output(self, acc) -> list[Cluster]:
        forest, members = acc
        return cl.clusters_of(forest, members)


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
