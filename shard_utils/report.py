"""Public import path of `shard_utils.read.report`."""
from shard_utils.read.report import *  # noqa: F401,F403
