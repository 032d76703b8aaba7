"""A dataset as it lies on disk: TFRecord framing, the record schema, the manifest, the per-record index,
generations of an append, and the seeded order records are kept in. What writers produce and readers trust."""

__all__: list[str] = []
