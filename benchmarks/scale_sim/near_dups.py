"""Near-duplicate clustering over 10^6-10^7 simulated signatures: what the largest grouped element holds.

    python -m benchmarks.scale_sim.near_dups [--records 1000000,10000000]

The signatures stand in for a real collection's: most random; 3 % in families of 2-4 near copies (0-10 bits
flipped from the family's first); 1 % one flat signature (0: a blank image's DCT bits); 5 % around 1,000
"look-alike" prototypes (14 bits flipped each: not near-duplicates, but they crowd band buckets). What the job's
steps would hold is computed with the job's own code (`shard_utils.quality.clusters`): the largest group of equal
signatures, the largest band bucket of distinct signatures (compared in blocks of MAX_BUCKET), the largest
partition one reducer holds (`GroupPartition`: its signatures and band values, for each choice of
PARTITION_BITS; the job's is `band_partitions.PARTITION_BITS`), the pairs compared over all buckets, the planted
pairs found (against the formula), and the union-find the one merging worker holds (`ComponentsFn`: only
signatures in clusters). The time a band bucket takes is measured on 2,000 of them with `verified_edges` and
multiplied out; one whole partition (the job's `reduce_partition`) and one full buffer (`cut`) are timed, with
their peak memory (tracemalloc).
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from shard_utils.quality import band_partitions as bp  # noqa: E402
from shard_utils.quality import clusters as cl  # noqa: E402
from shard_utils.quality.signature import NEAR_DISTANCE  # noqa: E402

FAMILY_SHARE, FLAT_SHARE, LOOKALIKE_SHARE = 0.03, 0.01, 0.05
PROTOTYPES, LOOKALIKE_FLIPS = 1000, 14
SAMPLE = 2000  # band buckets timed


def flip(sigs: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each signature with counts[i] distinct random bits flipped."""
    out = sigs.copy()
    for k in np.unique(counts):
        rows = np.nonzero(counts == k)[0]
        if k == 0:
            continue
        bits = np.argsort(rng.random((len(rows), 64)), axis=1)[:, :k].astype(np.uint64)
        masks = np.bitwise_or.reduce(np.uint64(1) << bits, axis=1)
        out[rows] ^= masks
    return out


def simulate_signatures(n: int, seed: int = 0):
    """(signatures, the planted family pairs as index pairs (first, copy), their distances)."""
    rng = np.random.default_rng(seed)
    sigs = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    n_fam = int(n * FAMILY_SHARE)
    sizes = rng.integers(2, 5, n_fam // 3)
    firsts = np.cumsum(np.concatenate([[0], sizes[:-1]]))
    members = int(sizes.sum())
    copies = np.concatenate([np.arange(f + 1, f + s) for f, s in zip(firsts, sizes, strict=True)])
    first_of = np.repeat(firsts, sizes - 1)
    flips = rng.integers(0, NEAR_DISTANCE + 1, len(copies))
    sigs[copies] = flip(sigs[first_of], flips, rng)
    flat = slice(members, members + int(n * FLAT_SHARE))
    sigs[flat] = 0
    start = flat.stop
    look = np.arange(start, start + int(n * LOOKALIKE_SHARE))
    protos = rng.integers(0, 2**63, PROTOTYPES, dtype=np.uint64)
    sigs[look] = flip(protos[rng.integers(0, PROTOTYPES, len(look))], np.full(len(look), LOOKALIKE_FLIPS), rng)
    return sigs, first_of, copies, flips


def measure(n: int) -> dict:
    start = time.perf_counter()
    sigs, first_of, copies, flips = simulate_signatures(n)
    banding = cl.Banding(NEAR_DISTANCE)
    distinct, same_counts = np.unique(sigs, return_counts=True)
    largest_bucket, pairs_compared, blocks_over_cap, buckets = 0, 0, 0, 0
    found = np.zeros(len(copies), dtype=bool)
    hottest = None
    partition_bits = (0, 1, 2, 3, 4)
    largest_partition = dict.fromkeys(partition_bits, 0)
    for band in range(banding.bands):
        column = banding.band_values(distinct, slice(band, band + 1))[:, 0]
        counts = np.bincount(column, minlength=1 << cl.BAND_BITS).astype(np.int64)
        for bits in partition_bits:
            per = counts.reshape(1 << bits, -1).sum(axis=1).max()
            largest_partition[bits] = max(largest_partition[bits], int(per))
        top = int(counts.argmax())
        if counts[top] > largest_bucket:
            largest_bucket, hottest = int(counts[top]), (band, top)
        buckets += int((counts > 1).sum())
        full, rest = counts // cl.MAX_BUCKET, counts % cl.MAX_BUCKET
        pairs_compared += int((full * cl.MAX_BUCKET * (cl.MAX_BUCKET - 1) // 2 + rest * (rest - 1) // 2).sum())
        blocks_over_cap += int((counts > cl.MAX_BUCKET).sum())
        a = banding.band_values(sigs[first_of], slice(band, band + 1))[:, 0]
        b = banding.band_values(sigs[copies], slice(band, band + 1))[:, 0]
        found |= a == b
    # band 0's buckets (up to SAMPLE of them) verified with the job's own function: the CPU a bucket takes
    column = banding.band_values(distinct, slice(0, 1))[:, 0]
    order = np.argsort(column, kind="stable")
    cuts = np.flatnonzero(np.diff(column[order])) + 1
    groups = [g for g in np.split(order, cuts) if len(g) > 1][:SAMPLE]
    held = [[(int(distinct[i]), f"gs://sim/{i:09d}.jpg") for i in g] for g in groups]
    t = time.process_time()
    for members in held:
        cl.verified_edges(members, NEAR_DISTANCE)
    per_bucket = (time.process_time() - t) / max(1, len(groups))
    parts = parts_of(banding, sigs)
    partition_held = sum(len(a) + len(b) + len(c) for a, b, c in parts)
    reduce_s, reduce_peak, edges = timed(lambda: bp.reduce_partition(banding, 0, parts).edges)
    buffer = sigs[:bp.MAX_BUFFER]
    cut_s, cut_peak, _ = timed(lambda: bp.cut(banding, buffer))
    band, value = hottest
    column = banding.band_values(distinct, slice(band, band + 1))[:, 0]
    bucket = [(int(s), f"gs://sim/{i:09d}.jpg") for i, s in enumerate(distinct[column == value][:cl.MAX_BUCKET])]
    # the one merging worker's union-find over signature nodes: planted pairs found and the flat signature
    forest = cl.UnionFind()
    nodes = bp.signed(sigs)
    for i, j in zip(first_of[found].tolist(), copies[found].tolist(), strict=True):
        forest.union((0, nodes[i]), (0, nodes[j]))
    forest.union((0, 0), (0, 0))
    clustered = int(np.isin(sigs, np.array([n for _, n in forest.parent], dtype=np.int64).view(np.uint64)).sum())
    bucket_bytes = len(pickle.dumps([(s.to_bytes(8, "big"), cl.Member(i, "train", (17,), (1234, 56),
                                                                       "f" * 64)) for s, i in bucket]))
    recall = {int(d): float(found[flips == d].mean()) for d in np.unique(flips)}
    return {"records": n, "distinct": len(distinct), "largest_same_signature": int(same_counts.max()),
            "bands": banding.bands, "largest_bucket": largest_bucket, "largest_bucket_bytes_held": bucket_bytes,
            "buckets_over_cap": blocks_over_cap, "pairs_compared": pairs_compared,
            "verify_cpu_s": buckets * per_bucket, "us_per_bucket": per_bucket * 1e6, "buckets": buckets,
            "planted_pairs": len(copies), "recall_by_distance": recall,
            "expected_at_threshold": banding.recall(NEAR_DISTANCE),
            "merge_nodes": len(forest.parent), "merge_records": clustered,
            "merge_bytes": len(pickle.dumps(forest.parent)),
            "largest_partition": largest_partition, "partitions": bp.partition_count(banding),
            "reduce_s": reduce_s, "reduce_peak": reduce_peak, "partition_held": partition_held, "reduce_edges": edges,
            "cut_s": cut_s, "cut_peak": cut_peak,
            "seconds": time.perf_counter() - start}


def parts_of(banding: cl.Banding, sigs: np.ndarray) -> list:
    """What partition 0 (band 0, values below 2**(16 - PARTITION_BITS)) receives from every buffer of MAX_BUFFER
    signatures, as the job cuts them (each buffer cut only where it lands there: the same part)."""
    out = []
    for start in range(0, len(sigs), bp.MAX_BUFFER):
        buffer = sigs[start:start + bp.MAX_BUFFER]
        lands = banding.band_values(buffer, slice(0, 1))[:, 0] >> (cl.BAND_BITS - bp.PARTITION_BITS) == 0
        out += [part for pid, part in bp.cut(banding, buffer[lands]) if pid == 0]
    return out


def timed(make) -> tuple[float, int, int]:
    """(seconds, peak bytes allocated, len of its result) of make(), run twice: timed, then traced."""
    t = time.process_time()
    result = make()
    seconds = time.process_time() - t
    tracemalloc.start()
    make()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, len(result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000,10000000")
    args = ap.parse_args()
    for n in (int(x) for x in args.records.split(",")):
        r = measure(n)
        recall = ", ".join(f"{d}: {v:.3f}" for d, v in r["recall_by_distance"].items())
        print(f"{r['records']:,} signatures ({r['distinct']:,} distinct), {r['bands']} bands:\n"
              f"  largest group of equal signatures (streamed): {r['largest_same_signature']:,}\n"
              f"  largest band bucket (held): {r['largest_bucket']:,} distinct signatures, "
              f"{r['largest_bucket_bytes_held']:,} pickled bytes for its first {cl.MAX_BUCKET:,}; "
              f"buckets over {cl.MAX_BUCKET:,}: {r['buckets_over_cap']}\n"
              f"  pairs compared: {r['pairs_compared']:.3g} in {r['buckets']:,} buckets of 2 or more "
              f"({r['us_per_bucket']:.0f} µs each, measured: {r['verify_cpu_s']:.0f} CPU s in all)\n"
              f"  planted pairs found by distance: {recall} (formula at {NEAR_DISTANCE}: "
              f"{r['expected_at_threshold']:.3f})\n"
              f"  largest partition (one reducer; 8 + 2 bytes a signature): "
              + ", ".join(f"{r['largest_partition'][b]:,} signatures at {r['bands'] << b} partitions"
                          for b in sorted(r['largest_partition'])) + "\n"
              f"  partition 0 of {r['partitions']} ({r['partition_held'] / 1e6:.1f} MB of parts) reduced: "
              f"{r['reduce_s']:.2f} CPU s, peak {r['reduce_peak'] / 1e6:.0f} MB allocated, {r['reduce_edges']:,} "
              f"edges; a buffer of {bp.MAX_BUFFER:,} cut: {r['cut_s'] * 1e3:.0f} CPU ms, peak "
              f"{r['cut_peak'] / 1e6:.0f} MB\n"
              f"  merge (one worker): {r['merge_nodes']:,} signature nodes ({r['merge_records']:,} records) in "
              f"clusters, {r['merge_bytes']:,} pickled bytes\n"
              f"  simulated in {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
