"""The seeded order of a dataset's records, and which split each one goes to: pure functions of a source id."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["sort_key", "sort_keys", "split_hash", "unit_hash", "choose_split"]


def sort_key(seed: int, key: str) -> int:
    """A 64-bit seeded hash of a record key: the global shuffle order."""
    return _top64(hashlib.sha256(_order_seed(seed) + key.encode()).digest())


def sort_keys(seed: int, keys: Iterable[str]) -> list[int]:
    """`sort_key` of each key: the seed's part of the hash taken once, each key's hashed on from a copy of it."""
    start = hashlib.sha256(_order_seed(seed))
    out = []
    for key in keys:
        h = start.copy()
        h.update(key.encode())
        out.append(_top64(h.digest()))
    return out


def _order_seed(seed: int) -> bytes:
    """What a sort key's hash reads before the key (sort_key and sort_keys must agree on it)."""
    return f"order:{seed}:".encode()


def _top64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big")


def split_hash(seed: int, key: str) -> int:
    """A 64-bit seeded hash of a record key that decides its split (by fraction, or its place in its class when
    stratified)."""
    return int.from_bytes(hashlib.sha256(f"split:{seed}:{key}".encode()).digest()[:8], "big")


def unit_hash(seed: int, key: str) -> float:
    """A seeded hash of a key mapped to [0, 1): used to assign splits by fraction."""
    return split_hash(seed, key) / 2**64


def choose_split(fractions: list[tuple[str, float]], seed: int, key: str) -> str:
    """The split whose cumulative fraction range holds the key's hash."""
    if len(fractions) == 1:  # the usual one split: no hash needed to know where every key goes
        return fractions[0][0]
    u = unit_hash(seed, key)
    total = sum(f for _, f in fractions)
    acc = 0.0
    for name, frac in fractions:
        acc += frac / total
        if u < acc:
            return name
    return fractions[-1][0]
