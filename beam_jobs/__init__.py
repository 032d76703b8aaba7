"""tpu-shards Beam jobs and the `tpu-shards` command line; `build(...)` runs the build from Python."""
from beam_jobs.api import BuildFailed, build
from beam_jobs.errors import UsageError

__all__ = ["BuildFailed", "UsageError", "build"]
