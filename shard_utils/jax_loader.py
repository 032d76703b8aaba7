"""Public import path of `shard_utils.read.jax_loader`."""
from shard_utils.read.jax_loader import *  # noqa: F401,F403
