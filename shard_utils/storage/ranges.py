"""Where to cut the rest of a listing into ranges of names, chosen from the names a listing has seen.

A listing that stopped after a few pages knows the first names of its range and nothing of the rest. The
rest is cut where a name's character could next change: after the last name seen, at each position from
the first character of the level's names down to the first position where the names seen differ, at each
character those names use where they vary. Numbered names (`IMG_00009999` last seen) are cut at IMG_0001,
IMG_0002, ... IMG_001, IMG_002, ...: ranges that grow tenfold, each listed by its own worker, which cuts
its own rest the same way; hashes and UUIDs are cut evenly by their first characters. Cut points never
hold a '/', so a sub-folder's names always fall in one range with the sub-folder. Pure: no listing here.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "FALLBACK_ALPHABET", "SAMPLE", "level_key", "varying_characters", "successor_cuts", "even_cuts", "cut_points",
    "start_of", "ranges_between"
]

FALLBACK_ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"  # in byte order
SAMPLE = 2000  # names looked at to learn where and with what characters names vary


def level_key(rel: str, level: str) -> str:
    """The part of a name (relative to the root) below `level` ('' or ending in '/') up to its next '/':
    the file's name, or the sub-folder's, at that level."""
    rest = rel[len(level):]
    return rest.split("/", 1)[0]


def varying_characters(names: Sequence[str], start: int) -> str:
    """The characters, sorted, at the positions from `start` on where the names use more than one."""
    step = max(1, len(names) // SAMPLE)
    columns: dict[int, set[str]] = {}
    for name in names[::step]:
        for i in range(start, len(name)):
            columns.setdefault(i, set()).add(name[i])
    found = set().union(*(c for c in columns.values() if len(c) > 1)) - {"/"}
    return "".join(sorted(found)) or FALLBACK_ALPHABET


def successor_cuts(keys: Sequence[str], limit: int) -> list[str]:
    """Up to `limit` cut points after the last of `keys` (names at one level, sorted, without '/'): the
    last key with one of its characters raised, at each position up to where the keys first differ,
    shallow positions first (they bound the largest ranges). Sorted."""
    first, last = keys[0], keys[-1]
    shared = len(os.path.commonprefix([first, last]))
    alphabet = varying_characters(keys, shared)
    cuts: list[str] = []
    for i in range(min(shared, len(last) - 1) + 1):
        raised = [last[:i] + c for c in alphabet if c > last[i]]
        if len(cuts) + len(raised) > limit:
            step = -(-len(raised) // max(1, limit - len(cuts)))
            cuts += raised[step - 1::step][:limit - len(cuts)]
            break
        cuts += raised
    return sorted(cuts)


def even_cuts(keys: Sequence[str], parts: int) -> list[str]:
    """Up to parts-1 of the keys (sorted, distinct), evenly spaced: cut points inside what has been seen."""
    n = len(keys)
    return sorted({keys[i * n // parts] for i in range(1, parts) if 0 < i * n // parts < n})


def cut_points(level: str, keys: Sequence[str], limit: int, seen_too: bool = False) -> list[str]:
    """Names (relative to the root) that cut the rest of a level, after the last of `keys` (its names seen so
    far, see level_key, sorted), into ranges; with seen_too, the range of the keys seen is cut too (a listing
    that hands all of its range on). Use with `ranges_between`."""
    cuts = [level + c for c in successor_cuts(keys, limit)]
    if seen_too:
        cuts += [level + c for c in even_cuts(keys, limit // 4 or 1)]
    return cuts


def start_of(after: tuple[str, bool]) -> tuple[str, bool]:
    """A range's start as (name, inclusive), with 'after the sub-folder a/' made 'from a0 on' ('0' follows
    '/' in byte order: the first name past all that a/ holds)."""
    name, inclusive = after
    return (name[:-1] + "0", True) if name.endswith("/") and not inclusive else after


def ranges_between(after: tuple[str, bool] | None, cuts: Sequence[str],
                   end: str | None) -> list[tuple[tuple[str, bool] | None, str | None]]:
    """The ranges (start, end) that the cuts lying inside (after, end) make of it: contiguous, in order, each
    name of the range in exactly one."""
    floor = start_of(after)[0] if after is not None else None
    kept = sorted(c for c in set(cuts) if (floor is None or c > floor) and (end is None or c < end))
    starts: list[tuple[str, bool] | None] = [after, *((c, True) for c in kept)]
    return list(zip(starts, [*kept, end], strict=True))
