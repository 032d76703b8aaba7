"""Public import path of `shard_utils.read.resume`."""
from shard_utils.read.resume import *  # noqa: F401,F403
