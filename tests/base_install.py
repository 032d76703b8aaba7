"""Run Python with only some installed packages importable: those of tpu-shards' base install (from its installed
metadata), or all but a few (top-level or dotted names: google.cloud). A `sitecustomize` on PYTHONPATH makes the others
raise ModuleNotFoundError in every process that starts (worker processes included), as they would if they had never been
installed."""
from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

VENV = {"pip", "setuptools"}  # what `python -m venv` installs before anything else
BLOCKER = """
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    BLOCKED = frozenset({blocked!r})

    def find_spec(self, name, path=None, target=None):
        if any(name == blocked or name.startswith(blocked + ".") for blocked in self.BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def base_closure(distribution: str = "tpu-shards") -> set[str]:
    """The canonical names of the distributions `pip install distribution` brings, without extras."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [(distribution, ())]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in environments):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {name for name, _ in seen}


def modules_outside(kept: set[str]) -> set[str]:
    """Top-level modules that only distributions outside `kept` provide."""
    return {module for module, dists in metadata.packages_distributions().items()
            if not {canonicalize_name(d) for d in dists} & kept}


def environment(folder: Path, blocked: set[str]) -> dict[str, str]:
    """os.environ with PYTHONPATH leading to a sitecustomize that makes `blocked` modules uninstalled."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def base_install_environment(folder: Path) -> dict[str, str]:
    """The environment of a base install of tpu-shards: every package its extras brought is uninstalled."""
    return environment(folder, modules_outside(base_closure() | VENV))
