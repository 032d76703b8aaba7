"""Public import path of `shard_utils.read.loader`."""
from shard_utils.read.loader import *  # noqa: F401,F403
