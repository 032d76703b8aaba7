"""Many MediaItems held as columns, one tuple a field: how listed items travel between a build's steps.

A chunk of items pickles as eight tuples, in which a value shared by many items (a folder's labels, no split) is
written once, instead of as an object and a dict an item; it is cut by index without making its items, and an
item is made only when read. Pickled once, it hands out the same bytes after that, and it is unpickled only when
read (the build's driver hands most chunks on without reading them)."""
from __future__ import annotations

import dataclasses
import operator
import pickle
from collections.abc import Iterable, Iterator, Sequence

from shard_utils.inputs import MediaItem

__all__ = ["FIELDS", "Elements", "MediaItems", "row_of"]

FIELDS = tuple(f.name for f in dataclasses.fields(MediaItem))
_SOURCE_ID, _URI, _SIZE, _LABELS, _SPLIT = range(5)  # columns read without making the items
row_of = operator.attrgetter(*FIELDS)  # an item's fields as a tuple, in FIELDS order
_EMPTY = tuple(() for _ in FIELDS)


class Elements(Sequence):
    """A read-only sequence whose elements `_elements()` gives (made or unpickled on first read): compared with
    any other, or with a list or tuple, by its elements."""

    __slots__ = ()

    def _elements(self) -> tuple:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._elements())

    def __getitem__(self, index):
        return self._elements()[index]

    def __iter__(self) -> Iterator:
        return iter(self._elements())

    def __eq__(self, other) -> bool:
        return isinstance(other, (Elements, list, tuple)) and self._elements() == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # unhashable, as the list it stands for (typeshed: a method)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._elements())!r})"


class MediaItems(Elements):
    """A read-only sequence of MediaItems held as columns (see the module's docstring)."""

    __slots__ = ("_columns", "_made", "_packed")

    def __init__(self, items: Iterable[MediaItem] = ()):
        self._made: tuple[MediaItem, ...] | None = tuple(items)
        self._columns: tuple[tuple, ...] | None = None
        self._packed: bytes | None = None

    @classmethod
    def of(cls, items: Iterable[MediaItem]) -> MediaItems:
        """The items as MediaItems: themselves when they already are."""
        return items if isinstance(items, MediaItems) else cls(items)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple]) -> MediaItems:
        """Items from their fields, one tuple an item in FIELDS order (as `row_of` gives them)."""
        return cls._of_columns(tuple(zip(*rows, strict=True)) if rows else _EMPTY)

    @classmethod
    def _of_columns(cls, columns: tuple[tuple, ...]) -> MediaItems:
        items = cls.__new__(cls)
        items._made, items._columns, items._packed = None, columns, None
        return items

    def columns(self) -> tuple[tuple, ...]:
        """One tuple a field, in FIELDS order."""
        if self._columns is None:
            if self._packed is not None:
                self._columns = pickle.loads(self._packed)
            else:
                assert self._made is not None  # MediaItems hold their items, their columns, or their bytes
                self._columns = tuple(zip(*map(row_of, self._made), strict=True)) if self._made else _EMPTY
        return self._columns

    @property
    def source_ids(self) -> tuple[str, ...]:
        return self.columns()[_SOURCE_ID]

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.columns()[_SIZE]

    @property
    def labels(self) -> tuple[tuple[str, ...], ...]:
        return self.columns()[_LABELS]

    @property
    def splits(self) -> tuple[str | None, ...]:
        return self.columns()[_SPLIT]

    def select(self, indices: Sequence[int]) -> MediaItems:
        """The items at these positions, in this order, none of them made."""
        if not indices:
            return MediaItems._of_columns(_EMPTY)
        if len(indices) == 1:
            return MediaItems._of_columns(tuple((column[indices[0]],) for column in self.columns()))
        pick = operator.itemgetter(*indices)
        return MediaItems._of_columns(tuple(map(pick, self.columns())))

    def _elements(self) -> tuple[MediaItem, ...]:
        if self._made is None:
            self._made = tuple(map(_made, zip(*self.columns(), strict=True)))
        return self._made

    def __len__(self) -> int:
        return len(self._made) if self._made is not None else len(self.columns()[0])

    def __getitem__(self, index):
        if self._made is None and isinstance(index, int):  # one item made alone (a sample's), not the chunk's
            return _made([column[index] for column in self.columns()])
        return self._elements()[index]

    def __reduce__(self):
        if self._packed is None:
            self._packed = pickle.dumps(self.columns(), protocol=pickle.HIGHEST_PROTOCOL)
        return _unpacked, (self._packed,)


def _unpacked(packed: bytes) -> MediaItems:
    items = MediaItems.__new__(MediaItems)
    items._made, items._columns, items._packed = None, None, packed
    return items


def _made(row: Sequence) -> MediaItem:
    """The MediaItem of one row: its fields set as unpickling sets them (a frozen dataclass's __init__ sets each
    through object.__setattr__, several times slower)."""
    item = object.__new__(MediaItem)
    item.__dict__.update(zip(FIELDS, row, strict=True))
    return item
