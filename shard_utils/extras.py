"""Optional dependencies (PyAV for video, TensorFlow for embeddings), imported only when a feature needs them."""
from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the pip extra that installs it."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise MissingExtra saying which `tpu-shards[extra]` to install for `purpose`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"{purpose} needs the Python module {module!r}, which cannot be imported ({exc}); "
                           f"install it with: pip install 'tpu-shards[{extra}]'") from None
