"""The two errors every part of the project may raise about a dataset being made."""
from __future__ import annotations


class PlanError(ValueError):
    """A split cannot be sharded as asked (too few records for the cores, bad --num-shards...)."""


class InternalError(RuntimeError):
    """A consistency check inside the job failed: a bug, not bad input (exit code 3, never retried as input)."""
