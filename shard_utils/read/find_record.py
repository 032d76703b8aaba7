"""Finding a record by the id a person has at hand: its source id (`train_images/1a2b.jpg`), a listing's id
(`1a2b`, made a path by the build's --path-template), or a file name with or without its extension; when
nothing matches, the closest source ids, so a typo is one look away from fixed.
"""
from __future__ import annotations

import difflib
import posixpath
from collections.abc import Callable, Iterable

from shard_utils.errors import TpuShardsError
from shard_utils.format.manifest import Manifest
from shard_utils.inputs.listings import resolve_path
from shard_utils.read.stored import StoredRecord

__all__ = ["MAX_CANDIDATES", "SUGGESTIONS", "NotFound", "wanted_ids", "stem", "find", "closest"]

MAX_CANDIDATES = 200_000  # source ids kept to suggest from (a larger dataset suggests from its first ones)
SUGGESTIONS = 3


class NotFound(LookupError, TpuShardsError):
    """No record matches; `closest` holds the nearest source ids (possibly none)."""

    def __init__(self, given: str, closest: list[str]):
        self.given, self.closest = given, closest
        super().__init__(self.message())

    def message(self, where: str = "") -> str:
        """One line: nothing matched (`where`, e.g. " in split 'test'"), and the closest source ids."""
        hint = f"; closest source ids: {', '.join(map(repr, self.closest))}" if self.closest else ""
        return f"no record{where} has source id {self.given!r}, nor is named by it as a listing id or file name{hint}"


def wanted_ids(m: Manifest, given: str) -> set[str]:
    """The source ids `given` can name exactly: itself, and the path the build's --path-template makes of it."""
    ids = {given}
    template = m.options.get("path_template")
    if isinstance(template, str) and template.count("{}") == 1:
        try:
            ids.add(resolve_path(template.replace("{}", given), m.input or ".")[0])
        except ValueError:
            pass  # not an id the template can make a path of
    return ids


def stem(source_id: str) -> str:
    """A source id's file name without its extension: the id Kaggle's folders name files by."""
    return posixpath.splitext(posixpath.basename(source_id))[0]


def find(m: Manifest, records: Iterable[StoredRecord], given: str,
         keep: Callable[[StoredRecord], bool] = lambda r: True) -> StoredRecord:
    """The first record (of those `keep` accepts) whose source id `given` names exactly; else the first whose file
    name, with or without extension, is `given`; else NotFound with the closest source ids."""
    wanted = wanted_ids(m, given)
    by_name: StoredRecord | None = None
    seen: list[str] = []
    for record in records:
        if not keep(record):
            continue
        sid = record.source_id
        if sid in wanted:
            return record
        if by_name is None and given in (posixpath.basename(sid), stem(sid)):
            by_name = record
        if len(seen) < MAX_CANDIDATES:
            seen.append(sid)
    if by_name is not None:
        return by_name
    raise NotFound(given, closest(given, seen))


def closest(given: str, source_ids: list[str]) -> list[str]:
    """The source ids nearest to `given`, compared whole and by their file name's stem."""
    by_key: dict[str, str] = {}
    for sid in source_ids:
        by_key.setdefault(sid, sid)
        by_key.setdefault(stem(sid), sid)
    found = difflib.get_close_matches(given, list(by_key), n=SUGGESTIONS * 2, cutoff=0.6)
    return list(dict.fromkeys(by_key[k] for k in found))[:SUGGESTIONS]
