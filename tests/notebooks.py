"""The code of an example notebook as one script, for tests that run it on CPU."""
from __future__ import annotations

from pathlib import Path

import nbformat


def code_cells(path: Path) -> list[str]:
    """The notebook's code cells (the notebook validated first)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def notebook_code(path: Path) -> str:
    """The notebook's code cells as one script, without shell (`!`) and magic (`%`) lines."""
    lines = [line for cell in code_cells(path) for line in cell.splitlines() + [""]
             if not line.lstrip().startswith(("!", "%"))]
    return "\n".join(lines)
