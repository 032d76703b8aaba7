"""Public import path of `shard_utils.read.random_access`."""
from shard_utils.read.random_access import *  # noqa: F401,F403
