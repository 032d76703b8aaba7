"""tpu-shards library: shard planning, record schema, manifest, storage and the TPU loader (no Beam needed)."""

__all__: list[str] = []

__version__ = "0.1.0"
