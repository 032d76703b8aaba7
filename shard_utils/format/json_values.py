"""The shape of a manifest's free-form values: how deep any value nests, and the JSON kind of each build option it
records, checked once on load so that every tool taking them back (append, reshard, the report, the loader) gets
what it expects or refuses the manifest in one line.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from shard_utils.format import names

__all__ = ["MAX_DEPTH", "MAX_INT", "depth_problem", "KINDS", "OPTION_KINDS", "option_problem"]

MAX_DEPTH = 32  # objects and lists inside each other; a manifest nests 5 deep, a --describe'd metadata a few more
MAX_INT = 2**63 - 1  # what an int64 holds: every count and option a manifest records
_LEAVES = frozenset({str, bool, type(None)})  # JSON values with nothing to check inside


def depth_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a parsed JSON value cannot be taken (nested deeper than `max_depth`, a number that is not finite or not
    an int64), naming the top-level field that holds it, or None. Iterative: a hostile depth never reaches Python's
    recursion limit."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= max_depth:
                return f"{where or 'the manifest'}: nests objects and lists more than {max_depth} deep"
            if set(map(type, item.values() if isinstance(item, dict) else item)) <= _LEAVES:
                continue  # strings, bools and nulls hold nothing to check: a label list is passed in one call
            children = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((child, depth + 1, where or names.shown(key)) for key, child in children)
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{where}: holds {item}, not a finite number"
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            return f"{where}: holds an integer beyond 64 bits"
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


KINDS: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "bool": lambda v: isinstance(v, bool),
    "int": _is_int,
    "number": _is_number,
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "list of int": lambda v: isinstance(v, list) and all(map(_is_int, v)),
    "list of string": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "split fractions": lambda v: isinstance(v, dict) and all(map(_is_number, v.values())),
}

# Recorded option -> the JSON kinds a build writes for it (an option not named here may hold any JSON value).
OPTION_KINDS: dict[str, tuple[str, ...]] = {
    "splits": ("split fractions", "string"), "stratify": ("bool",), "image_size": ("list of int", "null"),
    "resize": ("string",), "jpeg_quality": ("int",), "max_pixels": ("int", "null"), "background": ("list of int",),
    "validate": ("string",), "num_cores": ("int", "null"), "num_hosts": ("int", "null"), "tpu": ("string", "null"),
    "target_shard_mb": ("number", "null"), "num_shards": ("int", "null"), "seed": ("int", "null"),
    "label_offset": ("int", "null"), "shard_extension": ("string", "null"), "format": ("string", "null"),
    "max_rejected": ("string", "null"), "dedup": ("bool", "string", "null"), "follow_symlinks": ("bool", "null"),
    "listings": ("list of string",), "extra_columns": ("list of string",),
    "label_from_name": ("string", "null"), "path_column": ("string", "null"), "path_template": ("string", "null"),
    "label_column": ("string", "null"), "label_separator": ("string", "null"), "split_column": ("string", "null"),
    "extra_separator": ("string", "null"), "video_frames": ("int", "null"), "video_fps": ("number", "null"),
    "embed_model": ("string", "null"), "metadata": ("object",),
}


def option_problem(options: Mapping[str, Any]) -> str | None:
    """Why a manifest's recorded options cannot be taken back (one not of the kind a build writes), or None."""
    for name, kinds in OPTION_KINDS.items():
        if name in options and not any(KINDS[k](options[name]) for k in kinds):
            return f"options.{name} must be {' or '.join(kinds)}, got {type(options[name]).__name__}"
    return None
