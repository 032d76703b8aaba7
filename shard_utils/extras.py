"""Optional dependencies, installed with an extra, imported on demand; their install hints say what works here."""
from __future__ import annotations

import importlib
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from shard_utils.errors import TpuShardsError

__all__ = [
    "REPORT_EXTRA", "DISTRIBUTION", "MissingExtra", "require", "require_all", "import_problem", "install_hint",
    "source_checkout", "extra_requirements", "tensorflow_quietly"
]

REPORT_EXTRA = "report"  # matplotlib: the inspect report and its contact sheets
DISTRIBUTION = "tpu-shards"
# pip's name for a module whose package is named otherwise (the others: the module's own name).
_PACKAGES = {"PIL": "Pillow", "google_crc32c": "google-crc32c", "google.protobuf": "protobuf",
             "google.cloud.storage": "google-cloud-storage", "yaml": "PyYAML"}


class MissingExtra(ImportError, TpuShardsError):
    """An optional package is not installed; the message says the pip command that installs it here."""


def require(module: str, extra: str | None = REPORT_EXTRA, needed_for: str = "this") -> ModuleType:
    """Import an optional module, or raise MissingExtra with the pip command that brings it (extra None: a
    module of the base install, missing after an install with --no-deps). TensorFlow is imported without its
    start-up lines on stderr (see `tensorflow_quietly`)."""
    try:
        if module.split(".")[0] == "tensorflow" and "tensorflow" not in sys.modules:
            with tensorflow_quietly():
                return importlib.import_module(module)
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(import_problem(exc, module, needed_for, extra)) from None


def require_all(modules: Sequence[str], needed_for: str) -> None:
    """Raise one MissingExtra naming every module of the base install in `modules` that is not importable (after
    an install with --no-deps), so a user installs them all at once; one installed but failing to import is
    named with its own error."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if not _absent(exc, module):
                raise MissingExtra(import_problem(exc, module, needed_for, None)) from None
            missing.append(module)
    if missing:
        raise MissingExtra(_not_installed(needed_for, missing, None))


def import_problem(exc: ImportError, module: str, needed_for: str, extra: str | None) -> str:
    """Why `module` did not import, in one line with the pip command that mends it: it is not installed; or it is,
    but a package it imports is missing (named); or it is, and fails to import (its own error, first line)."""
    top = module.split(".")[0]
    if _absent(exc, module):
        return _not_installed(needed_for, [top], extra)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (f"{needed_for} needs {top}, which is installed but cannot import {exc.name}, a package it needs: "
                f"pip install {_package(exc.name)}")
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{needed_for} needs {top}, which is installed but fails to import ({detail}); mend or reinstall it: " \
           f"{install_hint(extra, top)}"


def _absent(exc: ImportError, module: str) -> bool:
    """Whether the import failed because `module` itself (or a package above it) is not installed."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return bool(name) and (module == name or module.startswith(f"{name}."))


def _package(module: str) -> str:
    """The pip package that provides a module (its top-level name unless known to differ)."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in _PACKAGES:
            return _PACKAGES[".".join(parts[:depth])]
    return parts[0]


def _not_installed(needed_for: str, modules: Sequence[str], extra: str | None) -> str:
    verb = "is" if len(modules) == 1 else "are"
    return f"{needed_for} needs {' and '.join(modules)}, which {verb} not installed: {install_hint(extra, *modules)}"


def install_hint(extra: str | None, *modules: str) -> str:
    """The pip command installing `extra` (None: the base install) where this copy runs. tpu-shards is not on a
    package index, so in a checkout (an editable or source-tree install) it is `pip install -e ".[extra]"`; for
    an installed wheel it is the extra's own packages, as this installation's metadata lists them (else the
    modules' names, which pip accepts as package names)."""
    checkout = source_checkout()
    if checkout is not None:
        where = "." if Path.cwd().resolve() == checkout else str(checkout)
        return f'pip install -e "{where}[{extra}]"' if extra else f'pip install -e "{where}"'
    packages = extra_requirements(extra) if extra else []
    return "pip install " + " ".join(shlex.quote(p) for p in packages or modules)


def source_checkout() -> Path | None:
    """The checkout this package is imported from (a folder holding setup.py beside it), or None if installed."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "setup.py").is_file() else None


def extra_requirements(extra: str) -> list[str]:
    """The requirements an extra adds, from the installed metadata ([] when it is not installed with metadata)."""
    from importlib import metadata  # here: a worker process that only imports this module never needs it

    try:
        from packaging.requirements import Requirement

        found = [Requirement(line) for line in metadata.requires(DISTRIBUTION) or []]
    except (ImportError, metadata.PackageNotFoundError):
        return []
    return [f"{r.name}{r.specifier}" for r in found
            if r.marker is not None and "extra" in str(r.marker) and r.marker.evaluate({"extra": extra})]


# absl's format: severity letter, MMDD, time (before absl is initialised: seconds since the epoch), thread,
# file:line] message. TF_CPP_MIN_LOG_LEVEL's levels.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ [^\]]+:\d+\] ")
_ABSL_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


@contextmanager
def tensorflow_quietly() -> Iterator[None]:
    """Within the block (TensorFlow's import), TensorFlow's native start-up lines do not reach stderr.

    Its libraries log with absl before anything can initialise absl logging, so TF_CPP_MIN_LOG_LEVEL does not
    hold them back (TensorFlow 2.21: "oneDNN custom operations are on ..." on CPUs with oneDNN, twice, each after
    absl's preamble). File descriptor 2 is captured while TensorFlow loads, then every line is written back except
    absl lines below TF_CPP_MIN_LOG_LEVEL (default 2 here: errors still show) and, when those are dropped, absl's
    preamble. Numerics are untouched: oneDNN stays as TensorFlow chose it.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"]) if os.environ["TF_CPP_MIN_LOG_LEVEL"].isdigit() else 0
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not _below(line, level)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _below(line: str, level: int) -> bool:
    """Whether a native log line is under the minimum level shown (absl's preamble goes with those lines)."""
    match = _ABSL_LINE.match(line)
    if match:
        return _ABSL_LEVELS[match.group(1)] < level
    return level > 0 and line.rstrip("\n") == _ABSL_PREAMBLE
