"""Where a planned shard goes: its file name, and its place among the split's shards (what its index rows say).

A build's shard i of S is `train-0000i-of-0000S` at place i. An append's generation g is named like a
split `train-g00g` and placed after the split's earlier shards, rotated so that hosts stay balanced
(`generations.host_offset`). The names themselves are made by `format.filenames`, through the TFRecord
format (the shards a build writes first). No Beam, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shard_utils.format import generations
from shard_utils.format.shard_formats import TFRECORD

__all__ = ["ShardNaming"]


@dataclass(frozen=True)
class ShardNaming:
    """Names and places of new shards. `base`: split -> (shards it already has, host offset) for an append."""

    extension: str = TFRECORD.extensions[0]
    generation: int = 0
    base: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def name(self, split: str, shard: int, count: int) -> str:
        """The file name of the planner's shard `shard` of `count`."""
        return TFRECORD.shard_name(split, self.position(split, shard, count), count, self.extension, self.generation)

    def position(self, split: str, shard: int, count: int) -> int:
        """The shard's place within its generation."""
        _, offset = self.base.get(split, (0, 0))
        return generations.position(shard, count, offset) if offset else shard

    def place(self, split: str, shard: int, count: int) -> int:
        """The shard's number in the split's index (after the split's earlier shards)."""
        before, _ = self.base.get(split, (0, 0))
        return before + self.position(split, shard, count)

    @staticmethod
    def for_build(extension: str) -> ShardNaming:
        if extension not in TFRECORD.extensions:
            raise ValueError(f"shard extension {extension!r} is not one of {', '.join(TFRECORD.extensions)}")
        return ShardNaming(extension)
