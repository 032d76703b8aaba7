"""Near-duplicate clustering over 10^6-10^7 simulated signatures: what the largest grouped element holds.

    python -m benchmarks.scale_sim.near_dups [--records 1000000,10000000]

The signatures stand in for a real collection's: most random; 3 % in families of 2-4 near copies (0-10 bits
flipped from the family's first); 1 % one flat signature (0: a blank image's DCT bits); 5 % around 1,000
"look-alike" prototypes (14 bits flipped each: not near-duplicates, but they crowd band buckets). What the job's
steps would hold is computed with the job's own code (`shard_utils.quality.clusters`): the largest group of equal
signatures (streamed, never held), the largest band bucket of distinct signatures (held: `GroupBand`, compared
in blocks of MAX_BUCKET), the pairs compared over all buckets, the planted pairs found (against the formula),
and the union-find the one merging worker holds (`ComponentsFn`: only records in clusters). The time to verify
a band bucket takes is measured on 2,000 of them with `verified_edges` and multiplied out.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

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
    for band in range(banding.bands):
        column = banding.band_values(distinct, slice(band, band + 1))[:, 0]
        counts = np.bincount(column, minlength=1 << cl.BAND_BITS).astype(np.int64)
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
    t = time.perf_counter()
    for members in held:
        cl.verified_edges(members, NEAR_DISTANCE)
    per_bucket = (time.perf_counter() - t) / max(1, len(groups))
    band, value = hottest
    column = banding.band_values(distinct, slice(band, band + 1))[:, 0]
    bucket = [(int(s), f"gs://sim/{i:09d}.jpg") for i, s in enumerate(distinct[column == value][:cl.MAX_BUCKET])]
    # the one merging worker's union-find: planted pairs found and the flat group's members
    forest = cl.UnionFind()
    for i, j in zip(first_of[found].tolist(), copies[found].tolist(), strict=True):
        forest.union(f"gs://sim/{i:09d}.jpg", f"gs://sim/{j:09d}.jpg")
    flat_ids = np.nonzero(sigs == 0)[0]
    for j in flat_ids[1:].tolist():
        forest.union(f"gs://sim/{flat_ids[0]:09d}.jpg", f"gs://sim/{j:09d}.jpg")
    bucket_bytes = len(pickle.dumps([(s.to_bytes(8, "big"), cl.Member(i, "train", (17,), (1234, 56),
                                                                       "f" * 64)) for s, i in bucket]))
    recall = {int(d): float(found[flips == d].mean()) for d in np.unique(flips)}
    return {"records": n, "distinct": len(distinct), "largest_same_signature": int(same_counts.max()),
            "bands": banding.bands, "largest_bucket": largest_bucket, "largest_bucket_bytes_held": bucket_bytes,
            "buckets_over_cap": blocks_over_cap, "pairs_compared": pairs_compared,
            "verify_cpu_s": buckets * per_bucket, "us_per_bucket": per_bucket * 1e6, "buckets": buckets,
            "planted_pairs": len(copies), "recall_by_distance": recall,
            "expected_at_threshold": banding.recall(NEAR_DISTANCE),
            "merge_records": len(forest.parent), "merge_bytes": len(pickle.dumps(forest.parent)),
            "seconds": time.perf_counter() - start}


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
              f"  merge (one worker): {r['merge_records']:,} records in clusters, {r['merge_bytes']:,} pickled bytes\n"
              f"  simulated in {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
