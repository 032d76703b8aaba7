"""tpu-shards Beam jobs and the `tpu-shards` command line; `build(...)` runs the build from Python.

`build`, `BuildFailed`, `UsageError` and `TpuShardsError` (the base of every error the project raises) are
imported on first use, so that importing a submodule (a local build's worker process does) costs nothing more."""
from __future__ import annotations

from typing import Any

__all__ = ["BuildFailed", "TpuShardsError", "UsageError", "build"]


def __getattr__(name: str) -> Any:
    if name in ("build", "BuildFailed"):
        from beam_jobs import api

        return getattr(api, name)
    if name == "UsageError":
        from beam_jobs.errors import UsageError

        return UsageError
    if name == "TpuShardsError":
        from beam_jobs.errors import TpuShardsError

        return TpuShardsError
    raise AttributeError(f"module 'beam_jobs' has no attribute {name!r}")
