"""tpu-shards library: shard planning, record schema, manifest, storage and the TPU loader (no Beam needed)."""
__version__ = "0.1.0"
