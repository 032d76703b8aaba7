"""Stratify: every listed item's split, cut per class at the split fractions (`--stratify`).

    media ─► (class, split hash) ─► per class: sorted hashes ─► cuts ─► one {class: cuts} ─► each item's split

Only 8-byte hashes travel to be grouped (a class's hashes are sorted on one worker: 80 MB for a class of 10^7
items); the items stay where they were listed and learn their split from the small table of cuts, joined to
them rather than read as a side input (see `WithSingleton`). The table depends only on the listed source ids,
their labels and the seed: the same splits on every runner, with any number of workers.
"""
from __future__ import annotations

from array import array
from dataclasses import replace

import apache_beam as beam
import numpy as np

from beam_jobs.pipeline.common import WithSingleton
from shard_utils.format.order import split_hash
from shard_utils.inputs import MediaItem
from shard_utils.inputs.items import MediaItems
from shard_utils.sharding import stratify

__all__ = ["Stratify"]


class Stratify(beam.PTransform):
    """Input: chunks of MediaItems. Output: the same chunks, every item's `split` set from its class's cuts."""

    def __init__(self, splits: tuple[tuple[str, float], ...], seed: int):
        super().__init__()
        self.names = tuple(name for name, _ in splits)
        self.fractions = tuple(fraction for _, fraction in splits)
        self.seed = seed

    def expand(self, media):
        fractions, names, seed = self.fractions, self.names, self.seed
        cuts = (media
                | "ClassHashes" >> beam.FlatMap(lambda chunk: ((item.labels, split_hash(seed, item.source_id))
                                                               for item in chunk))
                | "PerClass" >> beam.CombinePerKey(HashesFn())
                | "Cuts" >> beam.MapTuple(lambda labels, hashes: (labels, stratify.class_cuts(
                    np.frombuffer(hashes, dtype=np.uint64), fractions)))
                | "Table" >> beam.combiners.ToDict())
        return (media
                | "WithCuts" >> WithSingleton(cuts)
                | "Assign" >> beam.Map(lambda pair: assign_chunk(pair[0], pair[1], names, seed)))


class HashesFn(beam.CombineFn):
    """A class's split hashes, packed 8 bytes each (array of unsigned 64-bit)."""

    def create_accumulator(self) -> array:
        return array("Q")

    def add_input(self, acc: array, value: int) -> array:
        acc.append(value)
        return acc

    def merge_accumulators(self, accs) -> array:
        merged = array("Q")
        for acc in accs:
            merged.extend(acc)
        return merged

    def extract_output(self, acc: array) -> bytes:
        return acc.tobytes()


def assign_chunk(chunk: list[MediaItem], cuts: dict, names: tuple[str, ...], seed: int) -> MediaItems:
    """The chunk's items with the split their class's cuts give them."""
    return MediaItems(replace(item, split=stratify.split_of(names, cuts[item.labels], split_hash(seed, item.source_id)))
                 for item in chunk)
