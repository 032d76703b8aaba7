"""Many small elements travelling as one: between steps (a Chunk), and to a local build's worker processes (a
run's items, Chained from its chunks). No Beam: a worker process unpickles them."""
from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence

__all__ = ["Chunk", "Chained"]


class _Elements(Sequence):
    """A read-only sequence whose elements `_elements()` gives (unpickled on first read)."""

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
        return isinstance(other, (_Elements, list, tuple)) and self._elements() == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # unhashable, as the list it stands for (typeshed: a method)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._elements())!r})"


class Chunk(_Elements):
    """Many small elements (listed files, keyed items) travelling between steps as one, read-only.

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


class Chained(_Elements):
    """The elements of several Chunks as one read-only sequence (a run's items, from its grouped chunks).

    It pickles as its Chunks, each as the bytes it came with: a run on its way to a worker process is neither
    unpickled nor pickled again item by item, and the build holds it as those bytes while the run is encoded."""

    __slots__ = ("_chunks", "_flat")

    def __init__(self, chunks: Iterable[Chunk]):
        self._chunks = tuple(chunks)
        self._flat: tuple | None = None

    def _elements(self) -> tuple:
        if self._flat is None:
            self._flat = tuple(x for chunk in self._chunks for x in chunk)
        return self._flat

    def __reduce__(self):
        return Chained, (self._chunks,)
