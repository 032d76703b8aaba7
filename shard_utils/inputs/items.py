"""Many listed files (storage.Entry) or media items (MediaItem) held as columns, one tuple a field: how they travel
between a build's steps.

A chunk pickles as a few tuples, in which a value shared by many (a folder's labels, no split) is written once,
instead of as an object and a dict each; it is cut by position without making its elements, and an element is made
only when read. Pickled once, it hands out the same bytes after that, and it is unpickled only when read (the build's
driver hands most chunks on without reading them)."""
from __future__ import annotations

import dataclasses
import itertools
import operator
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

from shard_utils.inputs import MediaItem
from shard_utils.storage import Entry

__all__ = ["Elements", "Columns", "MediaItems", "Entries", "row_of"]

row_of = operator.attrgetter(*(f.name for f in dataclasses.fields(MediaItem)))  # a MediaItem's fields, in order


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


class Columns(Elements):
    """A read-only sequence of one frozen dataclass's instances (`KIND`) held as columns, one tuple a field in the
    dataclass's order (see the module's docstring). An element is made as unpickling makes it: its fields set in its
    __dict__, not through the dataclass's __init__ (a frozen one sets each through object.__setattr__, several times
    slower); so KIND has no __post_init__."""

    __slots__ = ("_columns", "_made", "_packed")
    KIND: ClassVar[type]
    FIELDS: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls.FIELDS = tuple(f.name for f in dataclasses.fields(cls.KIND))

    def __init__(self, elements: Iterable = ()):
        self._made: tuple | None = tuple(elements)
        self._columns: tuple[tuple, ...] | None = None
        self._packed: bytes | None = None

    @classmethod
    def of(cls, elements: Iterable):
        """The elements as this sequence: themselves when they already are."""
        return elements if isinstance(elements, cls) else cls(elements)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple]):
        """Elements from their fields, one tuple an element, in FIELDS order."""
        return cls._of_columns(tuple(zip(*rows, strict=True)) if rows else cls._empty())

    @classmethod
    def joined(cls, parts: Sequence[Columns]):
        """The elements of several, in order, as one (none of them made)."""
        if len(parts) == 1:
            return parts[0]
        return cls._of_columns(tuple(tuple(itertools.chain.from_iterable(column))
                                     for column in zip(*(part.columns() for part in parts), strict=True))
                               if parts else cls._empty())

    @classmethod
    def _empty(cls) -> tuple[tuple, ...]:
        return tuple(() for _ in cls.FIELDS)

    @classmethod
    def _of_columns(cls, columns: tuple[tuple, ...]):
        out = cls.__new__(cls)
        out._made, out._columns, out._packed = None, columns, None
        return out

    def columns(self) -> tuple[tuple, ...]:
        """One tuple a field, in FIELDS order."""
        if self._columns is None:
            if self._packed is not None:
                self._columns = pickle.loads(self._packed)
            else:
                assert self._made is not None  # it holds its elements, their columns, or their bytes
                fields = operator.attrgetter(*self.FIELDS)
                self._columns = tuple(zip(*map(fields, self._made), strict=True)) if self._made else self._empty()
        return self._columns

    def select(self, positions: Sequence[int]):
        """The elements at these positions, in this order, none of them made."""
        if not positions:
            return self._of_columns(self._empty())
        if len(positions) == 1:
            return self._of_columns(tuple((column[positions[0]],) for column in self.columns()))
        pick = operator.itemgetter(*positions)
        return self._of_columns(tuple(map(pick, self.columns())))

    def _make(self, row: Iterable) -> Any:
        made = object.__new__(self.KIND)
        made.__dict__.update(zip(self.FIELDS, row, strict=True))
        return made

    def _elements(self) -> tuple:
        if self._made is None:
            self._made = tuple(map(self._make, zip(*self.columns(), strict=True)))
        return self._made

    def __len__(self) -> int:
        return len(self._made) if self._made is not None else len(self.columns()[0])

    def __getitem__(self, index):
        if self._made is None and isinstance(index, int):  # one element made alone (a sample's), not the chunk's
            return self._make([column[index] for column in self.columns()])
        return self._elements()[index]

    def __reduce__(self):
        if self._packed is None:
            self._packed = pickle.dumps(self.columns(), protocol=pickle.HIGHEST_PROTOCOL)
        return _unpacked, (type(self), self._packed)


def _unpacked(kind: type[Columns], packed: bytes) -> Columns:
    out = kind.__new__(kind)
    out._made, out._columns, out._packed = None, None, packed
    return out


class MediaItems(Columns):
    """MediaItems held as columns: what the listing step gives, and a run's items on their way to its worker."""

    __slots__ = ()
    KIND = MediaItem

    @property
    def source_ids(self) -> tuple[str, ...]:
        return self.columns()[0]

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.columns()[2]

    @property
    def labels(self) -> tuple[tuple[str, ...], ...]:
        return self.columns()[3]

    @property
    def splits(self) -> tuple[str | None, ...]:
        return self.columns()[4]


class Entries(Columns):
    """Listed files (storage.Entry) held as columns: what the listing step hands to the one that sorts them."""

    __slots__ = ()
    KIND = Entry

    @property
    def paths(self) -> tuple[str, ...]:
        return self.columns()[0]

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.columns()[1]

    @property
    def reasons(self) -> tuple[str | None, ...]:
        return self.columns()[2]
