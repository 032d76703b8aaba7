"""Media in: reading source files (bounded, overlapped, transient failures kept apart from definite ones)
and turning each into one record."""

__all__: list[str] = []
