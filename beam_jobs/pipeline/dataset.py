"""ShardMedia: the steps a build and an append share, from listed media to shards under temporary names.

    media ─► [Stratify] ─► PlanLayout ─► EncodeRuns ─► FindNearDuplicates ─► ActOnClusters ─► [MoveRecords]
          ─► [CarryLatest] ─► PlanShards ─► WriteShards

Byte-identical files (--dedup) are the near-duplicate clusters' distance-0 members: one step finds both.
"""
from __future__ import annotations

import apache_beam as beam

from beam_jobs.pipeline.carry import CarryLatest
from beam_jobs.pipeline.encode import EncodeRuns
from beam_jobs.pipeline.near_dups import ActOnClusters, FindNearDuplicates, MoveRecords
from beam_jobs.pipeline.plan_runs import PlanLayout
from beam_jobs.pipeline.shards import PlanShards
from beam_jobs.pipeline.stratify import Stratify
from beam_jobs.pipeline.write import WriteShards
from beam_jobs.run.config import BuildConfig
from shard_utils.format.manifest import Manifest
from shard_utils.quality.signature import NEAR_DISTANCE
from shard_utils.sharding.carry import latest_generations
from shard_utils.sharding.naming import ShardNaming

__all__ = ["ShardMedia"]


class ShardMedia(beam.PTransform):
    """Input: chunks of MediaItems. Outputs (a dict): shards (ShardResult), plans ({split: SplitShards}, once),
    failure (why no shard could be planned), rejected (dicts), cross_split (duplicates across splits), encoded
    (records each run encoded), quality (the images' flags, a tuple of finding dicts a run, and the near-duplicate
    clusters' finding dicts).

    `labels`: every label name (once each); `known_labels` (an append: the dataset's) keep their ids.
    `existing` (an append): (packed signature or None, Member) of the dataset's records, which new records'
    clusters may join (`near_dups.FindNearDuplicates`).
    `grows` (an append): the dataset, whose splits' latest generations take in new records too few for shards
    of their own (`CarryLatest`)."""

    def __init__(self, config: BuildConfig, labels, run, naming: ShardNaming, known_labels: tuple[str, ...] = (),
                 existing=None, grows: Manifest | None = None):
        super().__init__()
        self.config, self.labels, self.run, self.naming = config, labels, run, naming
        self.known_labels, self.existing, self.grows = tuple(known_labels), existing, grows

    def expand(self, media):
        cfg = self.config
        if cfg.stratify:
            media = media | "Stratify" >> Stratify(cfg.splits, cfg.seed)
        planned = media | "PlanLayout" >> PlanLayout(cfg)
        encoded = planned["keyed"] | "EncodeRuns" >> EncodeRuns(cfg, planned["layouts"], self.labels, self.run,
                                                                self.known_labels)
        found = encoded.runs | "FindNearDuplicates" >> FindNearDuplicates(NEAR_DISTANCE, self.existing, cfg.dedup)
        acted = found | "ActOnClusters" >> ActOnClusters(cfg.near_dups, cfg.dedup, self.labels, self.known_labels)
        dropped, cross_split = acted.dropped, acted.cross_split
        moved = (encoded.runs | "MoveRecords" >> MoveRecords(acted.moved, self.run, cfg.run_part_bytes)
                 if cfg.near_dups == "group" else None)
        carried, latest = None, None
        carry_failures: tuple[beam.PCollection, ...] = ()
        if self.grows is not None:
            latest = latest_generations(self.grows, cfg.num_cores * cfg.num_hosts)
            carry = encoded.runs | "CarryLatest" >> CarryLatest(cfg, self.grows, latest, self.run, dropped, moved)
            carried, carry_failures = carry["runs"], (carry["failure"],)
        sharded = encoded.runs | "PlanShards" >> PlanShards(cfg, planned["layouts"], self.naming, dropped, carried,
                                                            latest, moved)
        shards = sharded["tasks"] | "WriteShards" >> WriteShards(cfg, self.run)
        encoded_records = encoded.runs | "RecordsEncoded" >> beam.Map(lambda r: r.tally.records)
        return {"shards": shards, "plans": sharded["plans"], "encoded": encoded_records,
                "failure": (planned["failure"], sharded["failure"], *carry_failures) | "AnyFailure" >> beam.Flatten(),
                "rejected": (encoded.rejected, acted.rejected) | "EncodeRejects" >> beam.Flatten(),
                "cross_split": cross_split,
                "quality": (encoded.quality, acted.findings) | "AllFindings" >> beam.Flatten()}
