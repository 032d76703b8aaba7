"""Stratified splits (`--stratify`): each class cut into splits at its fractions, within one record of each.

Pure functions, no Beam. Within a class (an item's label tuple: one label, a multi-label set, or none for
unlabeled media), items are ordered by their seeded split hash (`order.split_hash`) and the order is cut at the
cumulative fractions, rounded: split k of a class of n gets round(n*F_k) - round(n*F_{k-1}) items, F the
cumulative fractions, which is within 1 of n*f_k. A cut is stored as the hash of the first item past it, so an
item's split follows from its hash and its class's cuts alone, whatever worker holds it. Two items of a class
with the same 64-bit hash fall on the same side of a cut (odds about n^2 / 2^65 per class).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["HASH_END", "cumulative_counts", "class_cuts", "split_of"]

HASH_END = 2**64  # past every 64-bit hash: a cut no item reaches


def cumulative_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """How many of a class's n items (in hash order) lie before the end of each split: rounded n * cumulative
    fraction, the last exactly n."""
    total = sum(fractions)
    counts, acc = [], 0.0
    for fraction in fractions[:-1]:
        acc += fraction / total
        counts.append(min(n, math.floor(n * acc + 0.5)))
    return counts + [n]


def class_cuts(hashes: np.ndarray, fractions: Sequence[float]) -> tuple[int, ...]:
    """The cuts of one class from its items' split hashes (uint64, any order): for each split but the last, the
    hash of the first item of the splits after it (HASH_END when none). Sorts the class's hashes: 8 bytes an item
    (a class of 10^7 items holds 80 MB on one worker)."""
    ordered = np.sort(np.asarray(hashes, dtype=np.uint64))
    n = len(ordered)
    return tuple(int(ordered[c]) if c < n else HASH_END for c in cumulative_counts(n, fractions)[:-1])


def split_of(names: Sequence[str], cuts: Sequence[int], split_hash: int) -> str:
    """The split of an item of a class with these cuts: the first whose cut lies past the item's hash."""
    return next((name for name, cut in zip(names, cuts, strict=False) if split_hash < cut), names[-1])
