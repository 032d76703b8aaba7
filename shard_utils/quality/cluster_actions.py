"""What a build does with a near-duplicate cluster (`--near-dups report|group|drop`, `--dedup`): pure functions.

- `--dedup`: a new member whose bytes an earlier member has (in the kept order: the dataset's records, then
  by source id) is rejected `duplicate`, naming that member, whatever the mode: byte-identical copies are the
  clusters' distance-0 members.
- report: nothing more moves or goes.
- group: every other new member not in the kept member's split moves there, so the cluster lies in one split.
  The kept member's split is its own hash's (or, on an append, the dataset record's): a cluster's split is
  chosen from a hash of its id (the kept member's source id), as a file's is from its own.
- drop: every new member but the kept one is rejected (`duplicate` when its bytes are the kept member's,
  else `near_duplicate`), naming the kept member.

Every cluster is also listed as findings: `near_duplicate` (every member, where it ends up) and `label_conflict`
(members with different labels); one whose members not rejected lie in several splits leaks (`findings.leaks`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shard_utils.quality import findings as found
from shard_utils.quality.clusters import Cluster, Member

__all__ = ["MODES", "Decision", "decide", "findings"]

MODES = ("report", "group", "drop")


@dataclass(frozen=True)
class Decision:
    """A cluster's new members rejected (member, the member it copies, rejection dict) and moved (member, target
    split)."""

    dropped: tuple[tuple[Member, Member, dict], ...] = ()
    moved: tuple[tuple[Member, str], ...] = ()

    def split_of(self, m: Member) -> str | None:
        """Where a member ends up: its split, the one it moves to, or None when it is rejected."""
        if any(d is m for d, _, _ in self.dropped):
            return None
        return next((target for moved, target in self.moved if moved is m), m.split)


def decide(cluster: Cluster, mode: str, dedup: bool = False) -> Decision:
    """What `mode` (and --dedup) does with the cluster's new members."""
    if mode not in MODES:
        raise ValueError(f"--near-dups {mode!r} must be one of {', '.join(MODES)}")
    kept = cluster.kept
    order = sorted(cluster.members, key=lambda m: (m.is_new, m.source_id))
    dropped: list[tuple[Member, Member, dict]] = []
    first_with: dict[str, Member] = {}
    for m in order:  # the kept member first
        twin = first_with.setdefault(m.sha256, m) if m.sha256 else m
        if not m.is_new or m is kept:
            continue
        if dedup and twin is not m:
            dropped.append((m, twin, _rejection(m, twin, same_bytes=True)))
        elif mode == "drop":
            same = bool(m.sha256) and m.sha256 == kept.sha256
            dropped.append((m, kept, _rejection(m, kept, same_bytes=same)))
    gone = {id(m) for m, _, _ in dropped}
    moved = tuple((m, kept.split) for m in order if mode == "group" and m.is_new and id(m) not in gone
                  and m.split != kept.split)
    return Decision(tuple(dropped), moved)


def _rejection(m: Member, named: Member, same_bytes: bool) -> dict:
    how = "kept" if named.is_new else "already in the dataset"
    what = "same bytes as" if same_bytes else "a near-duplicate of"
    return {"source": m.source_id, "reason": "duplicate" if same_bytes else "near_duplicate",
            "message": f"{what} {named.source_id} ({how}, in split {named.split})"}


def _name(label, names: Sequence[str]):
    return names[label] if isinstance(label, int) and 0 <= label < len(names) else label


def findings(cluster: Cluster, decision: Decision, label_names: Sequence[str] = ()) -> list[dict]:
    """The cluster's findings (`findings.finding`): a near_duplicate naming every member and the split where it
    ends up (a rejected one: where it was, listed in `rejected`), and a label_conflict when their labels differ.
    Details: the cluster's id, its kept member, each member's labels, the members moved, rejected, and (an
    append) already in the dataset."""
    members = cluster.members
    splits = [decision.split_of(m) or m.split for m in members]
    details = {"cluster": cluster.id, "kept": cluster.kept.source_id,
               "labels": [[_name(i, label_names) for i in m.labels] for m in members]}
    for name, chosen in (("moved", [m for m, _ in decision.moved]), ("rejected", [m for m, _, _ in decision.dropped]),
                         ("in_dataset", [m for m in members if not m.is_new])):
        if chosen:
            details[name] = sorted(m.source_id for m in chosen)
    sources = [m.source_id for m in members]
    out = [found.finding(found.NEAR_DUPLICATE, sources, splits, **details)]
    if len(cluster.labels) > 1:
        out.append(found.finding(found.LABEL_CONFLICT, sources, splits, **details))
    return out
