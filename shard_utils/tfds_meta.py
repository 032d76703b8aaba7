"""Public import path of `shard_utils.read.tfds_meta`."""
from shard_utils.read.tfds_meta import *  # noqa: F401,F403
