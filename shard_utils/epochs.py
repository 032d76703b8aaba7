"""Public import path of `shard_utils.read.epochs`."""
from shard_utils.read.epochs import *  # noqa: F401,F403
