"""Optional dependencies, installed with an extra (`pip install 'tpu-shards[report]'`), imported on demand."""
from __future__ import annotations

import importlib
from types import ModuleType

REPORT_EXTRA = "report"  # matplotlib and tqdm: the inspect report, extract and build progress bars


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str = REPORT_EXTRA, needed_for: str = "this") -> ModuleType:
    """Import an optional module, or raise MissingExtra saying which pip extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingExtra(f"{needed_for} needs {top}, which is not installed: pip install 'tpu-shards[{extra}]'"
                           ) from None
