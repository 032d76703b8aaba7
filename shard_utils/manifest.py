"""Public import path of `shard_utils.format.manifest`."""
from shard_utils.format.manifest import *  # noqa: F401,F403
