"""The near-duplicate graph's records a batch at a time (a run, or a buffer of a dataset's records): their
signatures as one array, and only the few records in some cluster made Members, found in one pass (pure
functions: beam_jobs.pipeline.near_dups moves the batches).

A batch is (signatures, fields): the signed records' signatures (8 big-endian bytes each, in one bytes), then
every record's Member fields as a plain tuple (source id, split, labels, where, sha256), the signed records first
in the signatures' order. Beam's coder writes that natively, where it would pickle a Member.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shard_utils.quality.clusters import Member

__all__ = ["MemberBatch", "Components", "batch_of", "fields_of", "member_of", "signatures_of"]

MemberBatch = tuple[bytes, tuple]  # (signed records' signatures: >u8 each, every record's Member fields)
BIG = np.dtype(">i8")  # a signature's bytes read as its node's int64 (int.from_bytes(..., signed=True))


def fields_of(member: Member | tuple) -> tuple:
    """A Member's fields as a plain tuple (a tuple is returned as it is)."""
    if isinstance(member, tuple):
        return member
    return member.source_id, member.split, member.labels, member.where, member.sha256


def member_of(member: Member | tuple) -> Member:
    """A Member, from itself or from the tuple of its fields."""
    return Member(*member) if isinstance(member, tuple) else member


def batch_of(signed: Iterable[tuple[bytes | None, Member | tuple]]) -> MemberBatch:
    """One batch of records given as (packed signature or None, Member or its fields)."""
    sigs: list[bytes] = []
    with_sig: list[tuple] = []
    without: list[tuple] = []
    for sig, member in signed:
        if sig is None:
            without.append(fields_of(member))
        else:
            sigs.append(sig)
            with_sig.append(fields_of(member))
    return b"".join(sigs), tuple(with_sig) + tuple(without)


def signatures_of(batch: MemberBatch) -> np.ndarray:
    """A batch's signatures as uint64, in its records' order."""
    return np.frombuffer(batch[0], dtype=">u8").astype(np.uint64)


class Components:
    """{node: component number} of the clusters' graph (nodes: (0, a signature's int64), (1, a SHA-256)),
    looked up a batch at a time: the signature nodes as a sorted array, the bytes' nodes as a dict."""

    def __init__(self, signatures: np.ndarray, numbers: np.ndarray, by_bytes: dict | None = None):
        """`signatures`: the signature nodes (int64), sorted; `numbers`: their components'; `by_bytes`: {sha256:
        component number} of the bytes' nodes."""
        self.signatures, self.numbers, self.by_bytes = signatures, numbers, by_bytes or {}

    @classmethod
    def of(cls, numbers: dict) -> Components:
        """From {node: component number}."""
        by_sig = sorted((node[1], n) for node, n in numbers.items() if node[0] == 0)
        return cls(np.array([s for s, _ in by_sig], dtype=np.int64), np.array([n for _, n in by_sig], dtype=np.int64),
                   {node[1]: n for node, n in numbers.items() if node[0] == 1})

    def __len__(self) -> int:
        return len(self.signatures) + len(self.by_bytes)

    def clustered(self, batch: MemberBatch, exact: bool) -> list[tuple[int, Member]]:
        """(component number, Member) of each record of the batch in some cluster: by its signature's node, else
        (`exact`) its bytes'."""
        raw, fields = batch
        found: dict[int, int] = {}
        if raw and len(self.signatures):
            sigs = np.frombuffer(raw, dtype=BIG)
            at = np.minimum(np.searchsorted(self.signatures, sigs), len(self.signatures) - 1)
            hits = np.flatnonzero(self.signatures[at] == sigs)
            found = dict(zip(hits.tolist(), self.numbers[at[hits]].tolist(), strict=True))
        if exact and self.by_bytes:
            for i, f in enumerate(fields):
                if i not in found and f[4] in self.by_bytes:
                    found[i] = self.by_bytes[f[4]]
        return [(number, member_of(fields[i])) for i, number in sorted(found.items())]
