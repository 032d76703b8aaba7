"""The base of every error tpu-shards raises, and the two errors every part of the project may raise about a
dataset being made."""
from __future__ import annotations

__all__ = ["TpuShardsError", "PlanError", "InternalError"]


class TpuShardsError(Exception):
    """Base of every exception tpu-shards defines: `except TpuShardsError` catches any of them. Each also keeps
    its built-in base (ValueError, RuntimeError, OSError...), so handlers written for those still work."""


class PlanError(ValueError, TpuShardsError):
    """A split cannot be sharded as asked (too few records for the cores, bad --num-shards...)."""


class InternalError(RuntimeError, TpuShardsError):
    """A consistency check inside the job failed: a bug, not bad input (exit code 3, never retried as input)."""
