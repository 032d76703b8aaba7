"""The steps of the shard-building graph, one module per step, the same on every runner:

    StartRun ─► ListMedia ─► PlanLayout ─► EncodeRuns ─► PlanShards ─► WriteShards ─► Publish
    (run id,    (a folder,   (shard count,  (each run's   (exact sizes;  (prefixes moved  (indexes joined,
     lock)       bucket or    runs cut by    items read,   shards as      or composed,     shards moved in,
                 listing,     key from the   encoded in    pieces of      the rest copied) manifest last)
                 fanned out)  listing)       key order)    runs)

Elements are batches (chunks of items, runs, shards), never single images: Beam's per-element cost is paid
per batch. No step holds something per record in one place except reading a small plan; records' bytes
never pass through a shuffle.
"""

__all__: list[str] = []
