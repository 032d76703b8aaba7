"""tf.train.Example bytes written directly: the protobuf runtime's deterministic serialization, byte for byte, as
pieces in which each large value (an image's JPEG) is the caller's own object, so that framing the record copies it
once (the runtime copies it into the message, out of it, then framing copies it again: about 1 ms for a phone
photo).

Only what is certain to match is written here: byte and int64 lists under distinct keys none of which is the
start of another (upb orders such keys its own way). Anything else (float lists, whose float32 rounding is the
runtime's) is None, for the runtime to serialize; so is, in example_pieces, a record without a value of LARGE bytes
or more, which the runtime serializes faster (about 12 us against 20 for an image record's nine features). Keys
known in advance that hold one value each (`single_values`: an image record of one label) are written in about 8 us
whatever their sizes: their order and heads are worked out once, and no list is built per feature.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BYTES", "INT64", "FLOAT", "Feature", "SMALL", "LARGE", "example_pieces", "SingleValues", "single_values",
           "single_value_pieces"]

BYTES = "bytes"
INT64 = "int64"
FLOAT = "float"
Feature = tuple[str, str, Sequence]  # (key, BYTES / INT64 / FLOAT, values), in the order the record adds them

SMALL = 4096  # pieces shorter than this are joined with their neighbours
LARGE = 64 * 1024  # a record needs a value this large for its copies to cost more than writing it here
_LIST_TAG = {BYTES: b"\x0a", FLOAT: b"\x12", INT64: b"\x1a"}  # Feature's oneof fields, length-delimited
_INT64_MIN, _UINT64 = -(1 << 63), (1 << 64) - 1
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_list(values: Sequence[bytes]) -> list[bytes]:
    """A BytesList's fields: each run of small values one piece, each large value a piece of its own."""
    pieces: list[bytes] = []
    small = b""
    for value in values:
        if len(value) < SMALL:
            small += b"\x0a" + _varint(len(value)) + value
        else:
            pieces += (small + b"\x0a" + _varint(len(value)), value)
            small = b""
    return [*pieces, small] if small or not pieces else pieces


def _int64_list(values: Sequence[int]) -> list[bytes] | None:
    """An Int64List's packed field (none when empty); None when a value is out of range (the runtime's error)."""
    packed = b""
    for value in values:
        value = operator.index(value)
        if not _INT64_MIN <= value < -_INT64_MIN:
            return None
        packed += _varint(value & _UINT64)
    return [b"\x0a" + _varint(len(packed)) + packed if packed else b""]


def _wrapped(head: bytes, pieces: list[bytes]) -> list[bytes]:
    """`pieces` as the content of a length-delimited field whose tag (and anything before it) is `head`."""
    if len(pieces) == 1 and len(pieces[0]) < SMALL:
        return [head + _varint(len(pieces[0])) + pieces[0]]
    head += _varint(sum(map(len, pieces)))
    return [head + pieces[0], *pieces[1:]] if len(pieces[0]) < SMALL else [head, *pieces]


def _ordered(keys: list[bytes]) -> bool:
    """Whether `keys` are distinct and none is the start of another (then upb sorts them as bytes)."""
    keys = sorted(keys)
    return all(not b.startswith(a) for a, b in zip(keys, keys[1:], strict=False))


def example_pieces(features: Sequence[Feature], large: int = LARGE) -> list[bytes] | None:
    """The deterministic serialization of an Example holding `features`, as pieces to join (or to frame); None
    when it is the protobuf runtime's to write (see the module's docstring), as when no value has `large` bytes."""
    if large and max((len(v) for _, kind, values in features if kind == BYTES for v in values), default=0) < large:
        return None  # one pass over the values: a nested any() cost about as much as the runtime's serialization
    entries: list[tuple[bytes, list[bytes]]] = []
    for key, kind, values in features:
        if kind == BYTES:
            listed: list[bytes] | None = _bytes_list(values)
        elif kind == INT64:
            listed = _int64_list(values)
        else:
            return None
        if listed is None:
            return None
        name = key.encode("utf-8")
        feature = _wrapped(_LIST_TAG[kind], listed)
        entries.append((name, _wrapped(b"\x0a" + _varint(len(name)) + name + b"\x12", feature)))
    if not _ordered([name for name, _ in entries]):
        return None
    body: list[bytes] = []
    for _, entry in sorted(entries):
        wrapped = _wrapped(b"\x0a", entry)
        if body and len(body[-1]) < SMALL and len(wrapped[0]) < SMALL:
            body[-1] += wrapped[0]
            body += wrapped[1:]
        else:
            body += wrapped
    return _wrapped(b"\x0a", body)


@dataclass(frozen=True)
class SingleValues:
    """Keys known in advance whose lists each hold one value (an image record's usual nine): the order in which the
    runtime writes them and each map entry's head (its key and its Feature's tag), worked out once; for an int64 key,
    the bytes before its packed value, whatever that value's length (1 to 10 bytes)."""

    order: tuple[tuple[int, bytes, tuple[bytes, ...] | None], ...]  # (the value's place, entry head, int64 heads)


def single_values(keys: Sequence[tuple[str, str]]) -> SingleValues | None:
    """The layout of features under these (key, BYTES / INT64), each of one value; None when they are the runtime's
    to write (a float list, a key repeated or the start of another)."""
    names = [key.encode("utf-8") for key, _ in keys]
    if any(kind not in (BYTES, INT64) for _, kind in keys) or not _ordered(names):
        return None
    order = []
    for i in sorted(range(len(names)), key=names.__getitem__):
        head = b"\x0a" + _varint(len(names[i])) + names[i] + b"\x12"
        order.append((i, head, tuple(_int64_head(head, n) for n in range(11)) if keys[i][1] == INT64 else None))
    return SingleValues(tuple(order))


def _int64_head(head: bytes, packed: int) -> bytes:
    """A map entry's bytes before its one int64, whose varint is `packed` bytes long."""
    feature = b"\x1a" + _varint(packed + 2) + b"\x0a" + _varint(packed)  # Int64List's packed field in a Feature
    entry = head + _varint(len(feature) + packed) + feature
    return b"\x0a" + _varint(len(entry) + packed) + entry


_BYTES_HEADS: dict[tuple[bytes, int], bytes] = {}  # (entry head, length) -> _bytes_head's bytes, for small values
_BYTES_HEADS_HELD = 4096


def _bytes_head(head: bytes, length: int) -> bytes:
    """A map entry's bytes before its one bytes value of `length` bytes (its BytesList in a Feature)."""
    listed = b"\x0a" + _varint(length)
    feature = b"\x0a" + _varint(len(listed) + length) + listed
    entry = head + _varint(len(feature) + length) + feature
    return b"\x0a" + _varint(len(entry) + length) + entry


def single_value_pieces(layout: SingleValues, values: Sequence) -> list[bytes] | None:
    """example_pieces of the layout's features holding these values (one each, in the layout's key order), written
    with no list built per feature: about half the time of the runtime's serialization of an image record's. None
    when a value is not a plain int in int64's range or bytes (then the features are example_pieces' to write)."""
    body: list[bytes] = []
    small: list[bytes] = []  # the entries since the last large value
    heads = _BYTES_HEADS
    for place, head, int64_heads in layout.order:
        value = values[place]
        if int64_heads is not None:
            if value.__class__ is not int or not _INT64_MIN <= value < -_INT64_MIN:
                return None
            packed = _ONE_BYTE[value] if 0 <= value < 0x80 else _varint(value & _UINT64)  # at most 10 bytes
            small += (int64_heads[len(packed)], packed)
        elif value.__class__ is not bytes:
            return None
        elif len(value) >= SMALL:  # its own piece, after the heads of its entry, feature and list
            small.append(_bytes_head(head, len(value)))
            body += (b"".join(small), value)
            small = []
        else:
            entry = heads.get((head, len(value)))
            if entry is None:
                entry = _bytes_head(head, len(value))
                if len(heads) < _BYTES_HEADS_HELD:
                    heads[head, len(value)] = entry
            small += (entry, value)
    if small or not body:
        body.append(b"".join(small))
    return _wrapped(b"\x0a", body)
