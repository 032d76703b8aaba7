"""How records become exactly balanced shards: pure functions over counts and keys, no Beam, no I/O.

- `run_plan`: before anything is encoded, each split's listing is cut into runs (contiguous ranges of its
  seeded key order) and its shard count is chosen (a reshard's copied records: one run per shard).
- `shards`: once every run is encoded, each shard of the split is described as pieces of the runs: most
  shards are a prefix of one run (written once), the rest are copied from the runs' tails.
"""
