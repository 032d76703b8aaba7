"""Optional dependencies, installed with an extra, imported on demand; their install hints say what works here."""
from __future__ import annotations

import importlib
import shlex
from importlib import metadata
from pathlib import Path
from types import ModuleType

REPORT_EXTRA = "report"  # matplotlib: the inspect report and its contact sheets
DISTRIBUTION = "tpu-shards"


class MissingExtra(ImportError):
    """An optional package is not installed; the message says the pip command that installs it here."""


def require(module: str, extra: str | None = REPORT_EXTRA, needed_for: str = "this") -> ModuleType:
    """Import an optional module, or raise MissingExtra with the pip command that brings it (extra None: a
    module of the base install, missing after an install with --no-deps)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingExtra(f"{needed_for} needs {top}, which is not installed: {install_hint(extra, top)}") from None


def install_hint(extra: str | None, module: str) -> str:
    """The pip command installing `extra` (None: the base install) where this copy runs. tpu-shards is not on a
    package index, so in a checkout (an editable or source-tree install) it is `pip install -e ".[extra]"`; for
    an installed wheel it is the extra's own packages, as this installation's metadata lists them (else the
    module's name)."""
    checkout = source_checkout()
    if checkout is not None:
        where = "." if Path.cwd().resolve() == checkout else str(checkout)
        return f'pip install -e "{where}[{extra}]"' if extra else f'pip install -e "{where}"'
    packages = extra_requirements(extra) if extra else []
    return "pip install " + " ".join(shlex.quote(p) for p in packages or [module])


def source_checkout() -> Path | None:
    """The checkout this package is imported from (a folder holding setup.py beside it), or None if installed."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "setup.py").is_file() else None


def extra_requirements(extra: str) -> list[str]:
    """The requirements an extra adds, from the installed metadata ([] when it is not installed with metadata)."""
    try:
        from packaging.requirements import Requirement

        found = [Requirement(line) for line in metadata.requires(DISTRIBUTION) or []]
    except (ImportError, metadata.PackageNotFoundError):
        return []
    return [f"{r.name}{r.specifier}" for r in found
            if r.marker is not None and "extra" in str(r.marker) and r.marker.evaluate({"extra": extra})]
