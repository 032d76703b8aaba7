"""Public import path of `shard_utils.format.index`."""
from shard_utils.format.index import *  # noqa: F401,F403
