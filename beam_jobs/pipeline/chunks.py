"""Many small elements travelling as one: between steps (a Chunk; listed items keyed for their runs, KeyedItems;
listed files and items themselves travel as `shard_utils.inputs.items` columns), and to a local build's worker
processes (a run's items, Chained from its chunks). No Beam: a worker process unpickles them."""
from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence

from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import Elements, MediaItems

__all__ = ["Chunk", "KeyedItems", "Chained"]


class Chunk(Elements):
    """Many small elements (the columns of KeyedItems) travelling between steps as one, read-only.

    Beam's default coder pickles each object it does not know on its own, and again whenever it measures a
    step's output (every output, when a collection has few elements). A Chunk pickles its elements once, in
    one call, and hands out the same bytes after that; they are unpickled only when read."""

    __slots__ = ("_items", "_packed")

    def __init__(self, items: Iterable = ()):
        self._items: tuple | None = tuple(items)
        self._packed: bytes | None = None

    def _elements(self) -> tuple:
        if self._items is None:
            assert self._packed is not None  # a Chunk holds its items, their pickled bytes, or both
            self._items = pickle.loads(self._packed)
        return self._items

    def __reduce__(self):
        if self._packed is None:
            self._packed = pickle.dumps(self._items, protocol=pickle.HIGHEST_PROTOCOL)
        return _unpacked_chunk, (self._packed,)


def _unpacked_chunk(packed: bytes) -> Chunk:
    chunk = Chunk.__new__(Chunk)
    chunk._items, chunk._packed = None, packed
    return chunk


class KeyedItems(Elements):
    """Listed items, each with its split and its place in the split's order: (split, order key, item) elements,
    held as three columns. The steps that plan and assign runs read the splits and keys alone, and cut the items
    (MediaItems) by position without making them; the columns travel as one Chunk (pickled once)."""

    __slots__ = ("_columns", "_rows")

    def __init__(self, splits: Sequence[str], orders: Sequence[tuple[int, str]], items: MediaItems):
        if not len(splits) == len(orders) == len(items):
            raise ValueError(f"{len(splits)} splits and {len(orders)} keys for {len(items)} items")
        self._columns = Chunk((tuple(splits), tuple(orders), items))
        self._rows: tuple | None = None

    @classmethod
    def of(cls, keyed: Iterable[tuple[str, tuple[int, str], MediaItem]]) -> KeyedItems:
        """(split, order key, item) elements as KeyedItems: themselves when they already are."""
        if isinstance(keyed, KeyedItems):
            return keyed
        rows = tuple(keyed)
        return cls([s for s, _, _ in rows], [o for _, o, _ in rows], MediaItems(i for _, _, i in rows))

    @property
    def splits(self) -> tuple[str, ...]:
        return self._columns[0]

    @property
    def orders(self) -> tuple[tuple[int, str], ...]:
        return self._columns[1]

    @property
    def items(self) -> MediaItems:
        return self._columns[2]

    def _elements(self) -> tuple:
        if self._rows is None:
            self._rows = tuple(zip(*self._columns, strict=True))
        return self._rows

    def __len__(self) -> int:
        return len(self.splits)

    def __reduce__(self):
        return _keyed, (self._columns,)


def _keyed(columns: Chunk) -> KeyedItems:
    keyed = KeyedItems.__new__(KeyedItems)
    keyed._columns, keyed._rows = columns, None
    return keyed


class Chained(Elements):
    """The elements of several chunks (Chunks, MediaItems) as one read-only sequence (a run's items, from its
    grouped chunks).

    It pickles as its chunks, each as the bytes it came with: a run on its way to a worker process is neither
    unpickled nor pickled again item by item, and the build holds it as those bytes while the run is encoded."""

    __slots__ = ("_chunks", "_flat")

    def __init__(self, chunks: Iterable[Sequence]):
        self._chunks = tuple(chunks)
        self._flat: tuple | None = None

    def _elements(self) -> tuple:
        if self._flat is None:
            self._flat = tuple(x for chunk in self._chunks for x in chunk)
        return self._flat

    def __reduce__(self):
        return Chained, (self._chunks,)
