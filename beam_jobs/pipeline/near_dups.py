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
needs as many rounds as a cluster's chain is long; a forest merge is exact in one pass.
"""
from __future__ import annotations

from typing import Iterable

import apache_beam as beam

from shard_utils.quality import clusters as cl
from shard_utils.quality.clusters import Banding, Cluster, Member, UnionFind
from shard_utils.sharding.encode_run import EncodedRun

from beam_jobs.pipeline.common import count

__all__ = ["ClusterSignatures", "FindNearDuplicates", "run_members"]

Signed = tuple  # (signature as 8 big-endian bytes, Member): Beam's int coder takes signed 64-bit values only


def packed(signature: int) -> bytes:
    return signature.to_bytes(8, "big")


def unpacked(signature: bytes) -> int:
    return int.from_bytes(signature, "big")


class FindNearDuplicates(beam.PTransform):
    """Input: EncodedRun. Output: Cluster, one element each (two or more members). `existing` (an append):
    (packed signature, Member) of the dataset's records, whose `where` is None. `threshold`: the most differing bits
    of a near pair."""

    def __init__(self, threshold: int, existing=None, cap: int = cl.MAX_BUCKET):
        super().__init__()
        self.threshold, self.existing, self.cap = threshold, existing, cap

    def expand(self, runs):
        signed = runs | "Signatures" >> beam.FlatMap(run_members)
        if self.existing is not None:
            signed = (signed, self.existing) | "WithDataset" >> beam.Flatten()
        return signed | "Cluster" >> ClusterSignatures(self.threshold, self.cap)


class ClusterSignatures(beam.PTransform):
    """Input: (packed signature, Member). Output: Cluster, one element each. `cap`: the distinct signatures of a band
    bucket compared all pairs at once (`clusters.verified_edges`)."""

    def __init__(self, threshold: int, cap: int = cl.MAX_BUCKET):
        super().__init__()
        self.banding, self.cap = Banding(threshold), cap

    def expand(self, signed):
        banding, cap = self.banding, self.cap
        same = (signed
                | "GroupSameSignature" >> beam.GroupByKey()
                | "Collapse" >> beam.FlatMap(collapse).with_outputs("edges", main="distinct"))
        near = (same.distinct
                | "BandKeys" >> beam.FlatMap(band_keys, banding)
                | "GroupBand" >> beam.GroupByKey()
                | "Verify" >> beam.FlatMap(verify_bucket, banding.threshold, cap))
        return ((same.edges, near)
                | "AllEdges" >> beam.Flatten()
                | "Components" >> beam.CombineGlobally(ComponentsFn()).without_defaults()
                | "Clusters" >> beam.FlatMap(lambda found: found))


def run_members(encoded: EncodedRun) -> Iterable[Signed]:
    """(packed signature, Member) of every record of a run that has a signature."""
    if encoded.file is None:
        return
    for position, entry in enumerate(encoded.file.entries()):
        meta = entry.meta
        sig = getattr(meta, "phash", None)
        if sig is None:
            continue
        yield packed(sig), Member(meta.source_id, encoded.split, tuple(meta.labels), (encoded.run, position), meta.sha256)


def collapse(grouped) -> Iterable:
    """Records of one signature: the first member (by Member order) goes on to the bands; each other is joined
    to it by an edge (tagged `edges`). The group is read twice as it streams, never held."""
    sig, members = grouped
    first = min(members)
    yield sig, first
    for m in members:
        if m != first:
            yield beam.pvalue.TaggedOutput("edges", (first, m))


def band_keys(signed: Signed, banding: Banding) -> Iterable[tuple[int, Signed]]:
    sig, _ = signed
    for key in banding.keys(unpacked(sig)):
        yield key, signed


def verify_bucket(grouped, threshold: int, cap: int) -> Iterable[tuple[Member, Member]]:
    """The near pairs of one band bucket, as a spanning forest: (member, member) edges."""
    _, signed = grouped
    members = {m.source_id: (unpacked(sig), m) for sig, m in signed}
    if len(members) < 2:
        return
    count("near_dup_buckets_verified")
    outcome = cl.verified_edges(((sig, source_id) for source_id, (sig, _) in members.items()), threshold, cap)
    if outcome.blocks > 1:
        count("near_dup_hot_buckets")
    for a, b in outcome.edges:
        yield members[a][1], members[b][1]


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
