"""How records become exactly balanced shards, without Beam: the plan (pure functions over counts and keys)
and the writers that follow it (run files, shard files, their copies), through `shard_utils.storage`.

- `run_plan`: before anything is encoded, each split's listing is cut into runs (contiguous ranges of its
  seeded key order) and its shard count is chosen (a reshard's copied records: one run per shard).
- `shards`: once every run is encoded, each shard of the split is described as pieces of the runs: most
  shards are a prefix of one run (written once), the rest are copied from the runs' tails.
"""

__all__: list[str] = []
