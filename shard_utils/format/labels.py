"""Label ids: which id each label name gets, and when that needs saying.

Ids are positions in the manifest's `labels`. When every label is an integer written plainly (`0`, `7`, `-1`;
not `007`, `+7` or `7.0`, which would make two names of one number), ids follow numeric order, so labels exactly
`0..K-1` get id = the integer: a prediction's id is the listing's label. Otherwise ids follow string order. An
append keeps every existing id; its new labels follow, in the same order rule over all of them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["is_integer_label", "numeric", "label_order", "renumbered"]

_INTEGER = re.compile(r"0|-?[1-9][0-9]*")


def is_integer_label(name: str) -> bool:
    """Whether a label is an integer literal in its one plain spelling (no sign but '-', no leading zero)."""
    return _INTEGER.fullmatch(name) is not None


def numeric(names: Iterable[str]) -> bool:
    """Whether every label name is an integer literal (and there is at least one)."""
    names = list(names)
    return bool(names) and all(map(is_integer_label, names))


def label_order(found: Iterable[str], known: Sequence[str] = ()) -> list[str]:
    """Label names by id: the known ones keep their ids, new ones follow in numeric order when every label is an
    integer literal, else in string order. A first build knows none."""
    have = set(known)
    new = set(found) - have
    if numeric([*known, *new]):
        return list(known) + sorted(new, key=int)
    return list(known) + sorted(new)


def renumbered(names: Sequence[str], limit: int = 12) -> str | None:
    """The mapping to show when numeric labels' ids are not the integers themselves ("3→0, 5→1, 9→2"), at most
    `limit` pairs and a count of the rest; None when the labels are not numeric or each id is its label."""
    if not numeric(names) or all(int(name) == i for i, name in enumerate(names)):
        return None
    pairs = [f"{name}→{i}" for i, name in enumerate(names)]
    more = f" and {len(pairs) - limit} more" if len(pairs) > limit else ""
    return ", ".join(pairs[:limit]) + more
