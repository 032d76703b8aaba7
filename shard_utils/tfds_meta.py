"""Public import path of `shard_utils.read.tfds_meta`."""
from shard_utils.read.tfds_meta import (
    GENERATION_0,
    array_record_builder,
    class_names,
    split_expression,
    tfds_files,
    tfds_split_name,
)

__all__ = ["GENERATION_0", "tfds_files", "class_names", "split_expression", "tfds_split_name", "array_record_builder"]
