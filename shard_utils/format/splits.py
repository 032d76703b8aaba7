"""Split expressions: which records of a dataset a reader takes, in TFDS's grammar where it fits (pure functions).

    train                      every record of a split
    train+validation           a union, in the order written (also a list: ["train", "validation"])
    fold0+fold1+fold2          folds built with --split-column
    train[:80%]  train[80%:]   a percentage slice: boundaries round to the nearest record, as TFDS's
                               `ReadInstruction(rounding="closest")` does (int(round(pct * n / 100)))
    train[10:20] train[-100:]  records by position, Python's slice semantics (negative counts from the end)
    train[:4shard] train[2shard]  whole shards
    all                        every split, in the manifest's order (unless a split is named "all")

Positions are the split's rows in shard order, the order of its index and of TFDS's reads, so `train[:80%]`
here holds the same records as TFDS's. A slice selects *records*, exactly: a boundary inside a shard cuts it,
and readers take that shard's records from the cut on (a `Piece` is one shard's contiguous part). Terms may not
overlap (a record is read once per pass) and none may be empty. A malformed expression, an empty or overlapping
term, is one line of ValueError naming what is wrong.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Piece", "Selection", "Term", "closest_names", "is_expression", "parse", "resolve"]

ALL = "all"
_TERM = re.compile(r"^(?P<name>[A-Za-z0-9_-]+)(?:\[(?P<slice>[^\[\]]*)\])?$")
_BOUND = re.compile(r"^(?P<value>-?(?:\d+(?:\.\d*)?|\.\d+))(?P<unit>%|shard)?$")
# Names people use for the same split: asking for one finds the others ("validation" when the dataset has "val").
ALIASES = (("validation", "valid", "val", "eval", "dev"), ("train", "training"), ("test", "testing"))


@dataclass(frozen=True)
class Term:
    """One `name[from:to]` of an expression; `unit` is "abs", "%" or "shard" (None bounds: the split's ends)."""

    text: str
    name: str
    start: float | int | None = None
    stop: float | int | None = None
    unit: str = "abs"


@dataclass(frozen=True)
class Piece:
    """Records `start` .. `stop - 1` of shard `shard` (its position in split `split`'s shard list)."""

    split: str
    shard: int
    start: int
    stop: int

    @property
    def num_records(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Selection:
    """The records an expression selects: shard pieces in reading order (whole shards where a term covers them)."""

    expression: str
    pieces: tuple[Piece, ...]
    whole: tuple[bool, ...]  # per piece: the whole shard

    @property
    def num_records(self) -> int:
        return sum(p.num_records for p in self.pieces)

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits the selection reads from, in order, once each."""
        return tuple(dict.fromkeys(p.split for p in self.pieces))


def is_expression(text: object) -> bool:
    """Whether `text` is more than a plain split name (a union or a slice): list, '+' or '['."""
    return not isinstance(text, str) or "+" in text or "[" in text


def _text(expression: str | Sequence[str]) -> str:
    """An expression or a list of them (their union) as one string; ValueError for anything else."""
    if isinstance(expression, str):
        text = expression
    elif isinstance(expression, Sequence) and expression and all(isinstance(e, str) for e in expression):
        text = "+".join(expression)
    else:
        raise ValueError(f"split must be a split name, an expression such as 'train[:80%]+validation', or a "
                         f"non-empty list of them; got {expression!r}")
    text = "+".join(part.strip() for part in text.split("+"))  # blanks around '+' mean nothing, as in TFDS
    if not text:
        raise ValueError("split is empty; give a split name such as 'train'")
    return text


def parse(expression: str | Sequence[str]) -> list[Term]:
    """The terms of an expression (or a list of them), checked for form only; ValueError naming the bad part."""
    text = _text(expression)
    return [_term(part, text) for part in text.split("+")]


def _term(part: str, whole: str) -> Term:
    match = _TERM.match(part)
    if not match:
        what = "an empty term" if not part else f"term {part!r}"
        raise ValueError(f"split expression {whole!r}: {what} is not a split name with an optional [from:to] slice "
                         "(e.g. train, train[:80%], train[10:20], train[:4shard])")
    name, inside = match["name"], match["slice"]
    if inside is None:
        return Term(part, name)
    bounds = inside.split(":")
    if len(bounds) > 2 or not any(bounds):
        raise ValueError(f"split expression {whole!r}: slice [{inside}] of {name!r} must be [from:to], [from:] or "
                         "[:to] (or [k shard] for one shard)")
    parsed = [_bound(b, part, whole) for b in bounds]
    units = {unit for _, unit in parsed if unit is not None}
    if len(units) > 1:
        shown = ", ".join(sorted("records" if u == "abs" else u for u in units))
        raise ValueError(f"split expression {whole!r}: {part!r} mixes units ({shown}); give both "
                         "bounds in records, in % or in shards")
    unit = units.pop() if units else "abs"
    if len(parsed) == 1:  # train[k shard]: one shard
        value = parsed[0][0]
        if unit != "shard" or value is None:
            raise ValueError(f"split expression {whole!r}: {part!r} needs a slice [from:to]; only shards may be "
                             "named alone (train[3shard])")
        return Term(part, name, value, (int(value) + 1) or None, unit)  # [-1shard]: the last one
    (start, _), (stop, _) = parsed
    return Term(part, name, start, stop, unit)


def _bound(text: str, part: str, whole: str) -> tuple[float | int | None, str | None]:
    """(value, unit) of one slice bound; (None, None) when empty."""
    if text == "":
        return None, None
    match = _BOUND.match(text)
    if not match:
        raise ValueError(f"split expression {whole!r}: bound {text!r} of {part!r} is not an integer, a percentage "
                         "(80%, 12.5%) or a shard count (4shard)")
    unit = match["unit"] or "abs"
    value = float(match["value"])
    if unit != "%":
        if not value.is_integer() or "." in match["value"]:
            raise ValueError(f"split expression {whole!r}: bound {text!r} of {part!r} must be a whole number of "
                             f"{'records' if unit == 'abs' else 'shards'}")
        return int(value), unit
    if not -100 <= value <= 100:
        raise ValueError(f"split expression {whole!r}: bound {text!r} of {part!r} is outside -100%..100%")
    return value, unit


def resolve(expression: str | Sequence[str], shard_records: Mapping[str, Sequence[int]]) -> Selection:
    """The pieces an expression selects from splits of these per-shard record counts (every name in it must be
    a key: check names first, so an unknown one gets its own message). ValueError for an empty, out-of-range or
    overlapping term."""
    text = _text(expression)
    pieces: list[Piece] = []
    whole: list[bool] = []
    taken: dict[str, list[tuple[int, int, str]]] = {}
    for term in parse(text):
        names = [term.name]
        if term.name == ALL and ALL not in shard_records:
            if term.text != ALL:
                raise ValueError(f"split expression {text!r}: {ALL!r} (every split) takes no slice; slice each split")
            names = list(shard_records)
        for name in names:
            counts = list(shard_records[name])
            first, last = _rows(term, counts, text)
            for earlier in taken.get(name, []):
                if first < earlier[1] and earlier[0] < last:
                    overlap = f"records {max(first, earlier[0])}..{min(last, earlier[1]) - 1} of {name!r}"
                    raise ValueError(f"split expression {text!r}: {term.text!r} and {earlier[2]!r} overlap "
                                     f"({overlap}); each record may be selected once")
            taken.setdefault(name, []).append((first, last, term.text))
            _cut(name, counts, first, last, pieces, whole)
    return Selection(text, tuple(pieces), tuple(whole))


def _rows(term: Term, counts: list[int], text: str) -> tuple[int, int]:
    """[first, last) rows of the split a term selects, as TFDS computes them; ValueError if out of range or empty."""
    n = sum(counts)
    if term.unit == "%":
        start = 0 if term.start is None else int(round(term.start * n / 100.0))
        stop = n if term.stop is None else int(round(term.stop * n / 100.0))
    elif term.unit == "shard":
        s = len(counts)
        for bound, last in ((term.start, s - 1), (term.stop, s)):
            if bound is not None and not -s <= bound <= last:
                raise ValueError(f"split expression {text!r}: {term.text!r} names shard {bound}; "
                                 f"{term.name!r} has {s} shards (0..{s - 1})")
        start = 0 if term.start is None else sum(counts[:int(term.start)])
        stop = n if term.stop is None else sum(counts[:int(term.stop)])
    else:
        for bound in (term.start, term.stop):
            if bound is not None and abs(bound) > n:
                raise ValueError(f"split expression {text!r}: {term.text!r} reaches record {bound}; {term.name!r} "
                                 f"has {n} records")
        start = 0 if term.start is None else int(term.start)
        stop = n if term.stop is None else int(term.stop)
    start, stop = start + n if start < 0 else start, stop + n if stop < 0 else stop
    if start >= stop:
        raise ValueError(f"split expression {text!r}: {term.text!r} selects no records (rows {start}..{stop} of "
                         f"{n})")
    return start, stop


def _cut(name: str, counts: list[int], first: int, last: int, pieces: list[Piece], whole: list[bool]) -> None:
    """Append the shard pieces holding rows [first, last) of a split, merging with a piece it continues."""
    begin = 0
    for shard, count in enumerate(counts):
        lo, hi = max(first, begin), min(last, begin + count)
        if lo < hi:
            piece = Piece(name, shard, lo - begin, hi - begin)
            if pieces and pieces[-1].split == name and pieces[-1].shard == shard and pieces[-1].stop == piece.start:
                piece = Piece(name, shard, pieces.pop().start, piece.stop)
                whole.pop()
            pieces.append(piece)
            whole.append(piece.num_records == count)
        begin += count


def closest_names(name: str, available: Sequence[str]) -> list[str]:
    """The split names a mistyped or aliased `name` most likely means: its aliases present, then close spellings."""
    lowered = name.lower()
    aliases = [a for group in ALIASES if lowered in group for a in group if a != lowered]
    found = [n for n in available if n.lower() in aliases]
    found += difflib.get_close_matches(name, [n for n in available if n not in found], n=3, cutoff=0.6)
    return found[:3]
