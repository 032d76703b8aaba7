"""Public import path of `shard_utils.read.verify`."""
from shard_utils.read.verify import *  # noqa: F401,F403
