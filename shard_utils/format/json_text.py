"""JSON text exactly as `json.dumps(value, indent=..., ensure_ascii=False)` writes it, in time linear and small in
long lists: a list or object of plain values (a manifest's labels and class counts) and a list of flat objects of
the same keys (Croissant's label records) are written by the C encoder or a template, not value by value through
the pure-Python encoder that `indent` selects. The bytes of manifest.json and croissant.json stay as they were.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from json.encoder import encode_basestring
from typing import Any

__all__ = ["dumps", "Records"]

_PLAIN = frozenset({str, int, float, bool, type(None)})


def dumps(value: Any, indent: int = 2) -> str:
    """`json.dumps(value, indent=indent, ensure_ascii=False)`, the same text."""
    return _text(value, 0, indent)


@dataclass(frozen=True)
class Records:
    """A list of objects given by its columns of plain values (`keys[i]` holds `columns[i]`), written as json writes
    that list: a million label records without a million dicts."""

    keys: tuple[str, ...]
    columns: tuple[Sequence[Any], ...]

    def rows(self) -> list[dict[str, Any]]:
        """The list of objects it stands for."""
        return [dict(zip(self.keys, values, strict=True)) for values in zip(*self.columns, strict=True)]

    def text(self, level: int, step: int) -> str:
        if not self.keys or not len(self.columns[0]):
            return "[]"
        outer, row, member = ("\n" + " " * (step * n) for n in (level, level + 1, level + 2))
        template = ("{{" + ",".join(member + encode_basestring(k).replace("{", "{{").replace("}", "}}") + ": {}"
                                    for k in self.keys) + row + "}}")
        members = map(template.format, *map(_column, self.columns))
        return "[" + row + ("," + row).join(members) + outer + "]"


def _column(values: Sequence[Any]) -> Any:
    """Each value's JSON text, by one C function for a column of strings or of integers."""
    kinds = {int} if isinstance(values, range) else set(map(type, values))
    if kinds == {str}:
        return map(encode_basestring, values)
    return map(int.__repr__, values) if kinds == {int} else map(_plain, values)


def _plain(v: Any) -> str:
    if type(v) is str:
        return encode_basestring(v)
    return int.__repr__(v) if type(v) is int else json.dumps(v)


def _text(value: Any, level: int, step: int) -> str:
    if isinstance(value, Records):
        return value.text(level, step)
    inner, close = "\n" + " " * (step * (level + 1)), "\n" + " " * (step * level)
    if isinstance(value, dict) and value and all(type(k) is str for k in value):
        if set(map(type, value.values())) <= _PLAIN:
            return _flat(value, inner, close)
        items = (f"{encode_basestring(k)}: {_text(v, level + 1, step)}" for k, v in value.items())
        return "{" + inner + ("," + inner).join(items) + close + "}"
    if isinstance(value, (list, tuple)) and value:
        if set(map(type, value)) <= _PLAIN:
            return _flat(value, inner, close)
        table = _table(value, level + 1, step)
        members = [table] if table is not None else (_text(v, level + 1, step) for v in value)
        return "[" + inner + ("," + inner).join(members) + close + "]"
    # scalars, empty containers, objects with keys that are not strings: json's own text, indented to its level
    return json.dumps(value, indent=step, ensure_ascii=False).replace("\n", close)


def _flat(value: Any, inner: str, close: str) -> str:
    """A non-empty list or object of plain values by the C encoder: its separators carry the indentation (an
    encoded string never holds a newline)."""
    body = json.dumps(value, ensure_ascii=False, separators=("," + inner, ": "))
    return body[0] + inner + body[1:-1] + close + body[-1]


def _table(rows: Any, level: int, step: int) -> str | None:
    """A list of non-empty objects of plain values with string keys (one level deeper than the list) by the C
    encoder, else None: its item separator indents their members, and each `},<separator>{` (which no encoded
    value holds: a value ends a string or a number, a key starts with a quote) is a boundary between two objects."""
    if set(map(type, rows)) != {dict} or not all(rows) or set(map(type, chain.from_iterable(rows))) != {str} \
            or not set(map(type, chain.from_iterable(map(dict.values, rows)))) <= _PLAIN:
        return None
    outer, inner = "\n" + " " * (step * level), "\n" + " " * (step * (level + 1))
    body = json.dumps(rows, ensure_ascii=False, separators=("," + inner, ": "))
    body = body[2:-2].replace("}," + inner + "{", outer + "}," + outer + "{" + inner)
    return "{" + inner + body + outer + "}"
