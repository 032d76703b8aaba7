"""Public import path of `shard_utils.read.loader`."""
from shard_utils.read.loader import (
    AUTOTUNE,
    FEATURE_MODES,
    LENGTH_SUFFIX,
    eval_steps,
    load_manifest,
    make_dataset,
    parse_spec,
    steps_per_epoch,
)

__all__ = [
    "AUTOTUNE", "FEATURE_MODES", "LENGTH_SUFFIX", "eval_steps", "load_manifest", "make_dataset", "parse_spec",
    "steps_per_epoch"
]
