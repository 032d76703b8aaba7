"""What `build --append` takes from the dataset it grows: every option its manifest records and the command line
does not give. An option given again must have the recorded value, except the few that only steer one run
(PER_RUN); one given with another value is refused in one line naming both values."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from beam_jobs.errors import UsageError

__all__ = [
    "RECORDED", "LISTING_SHAPE", "TOPOLOGY", "PER_RUN", "EXCLUSIVE", "given_options", "take_recorded", "check_same",
    "option_text", "with_option", "shown"
]


def _joined(value: Any) -> str | None:
    return ",".join(map(str, value)) if value else None


def _splits(value: Any) -> str | None:
    """--splits as typed from the recorded {name: fraction}; None for splits from folders or a column."""
    return ",".join(f"{name}={fraction}" for name, fraction in value.items()) if isinstance(value, dict) else None


def _same(value: Any) -> Any:
    return value


# Recorded option -> how its value is given back to the build's parser (the option's dest is the key).
RECORDED: dict[str, Callable[[Any], Any]] = {
    "splits": _splits, "stratify": bool, "image_size": _joined, "resize": _same, "jpeg_quality": _same,
    "max_pixels": _same, "background": _joined, "validate": _same, "target_shard_mb": _same,
    "seed": _same, "label_offset": _same, "shard_extension": _same, "format": _same, "max_rejected": _same,
    "dedup": bool, "near_dups": _same, "follow_symlinks": bool, "label_from_name": _same, "quality_checks": _same,
    # The listing's shape: taken only when the append reads a listing too.
    "path_column": _same, "path_template": _same, "label_column": _same, "label_separator": _same,
    "split_column": _same, "extra_separator": _same, "extra_columns": _joined,
}
LISTING_SHAPE = ("path_column", "path_template", "label_column", "label_separator", "split_column",
                 "extra_separator", "extra_columns")
TOPOLOGY = ("tpu", "num_cores", "num_hosts")  # compared as cores x hosts (check_appendable)
# Options that steer one run, not the records' shape or place: taken when not given, free to differ when given.
# (--num-shards is not taken at all: a generation's shard count follows its own records.)
PER_RUN = ("target_shard_mb", "dedup", "near_dups", "max_pixels", "validate", "max_rejected", "follow_symlinks",
           "quality_checks")
# Options the label sources exclude each other by: given one, the other is not taken.
EXCLUSIVE = {"label_column": "label_from_name", "label_from_name": "label_column"}


def given_options(ap: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the options a command line gives (an option left at its default is not given)."""
    for action in ap._actions:
        action.default = argparse.SUPPRESS
    return set(vars(ap.parse_known_args(argv)[0]))


def take_recorded(args: argparse.Namespace, given: Collection[str], recorded: Mapping[str, Any]) -> argparse.Namespace:
    """`args` with every recorded option the command line did not give set to its recorded value."""
    taken = dict(vars(args))
    for name, to_arg in RECORDED.items():
        if name in given or name not in recorded or EXCLUSIVE.get(name) in given:
            continue
        if name in LISTING_SHAPE and not args.listing:
            continue
        if name == "label_column" and recorded.get("label_from_name") is not None:
            continue
        taken[name] = to_arg(recorded[name])
    if not set(given) & set(TOPOLOGY):
        if recorded.get("tpu"):
            taken["tpu"] = recorded["tpu"]
        else:
            taken.update({name: recorded[name] for name in ("num_cores", "num_hosts") if name in recorded})
    return argparse.Namespace(**taken)


def check_same(recorded: Mapping[str, Any], now: Mapping[str, Any], given: Collection[str], where: str) -> None:
    """Refuse (UsageError, one line) an option whose value differs from the one the dataset was built with."""
    for name in RECORDED:
        if name in PER_RUN or name not in recorded or json.dumps(recorded[name], sort_keys=True) == json.dumps(
                now.get(name), sort_keys=True):
            continue
        was = f"the dataset was built {with_option(name, recorded[name])}"
        if name in given:
            raise UsageError(f"{where}: {option_text(name, now.get(name))} given, {was}; an append uses the first "
                             "build's options (reshard or rebuild to change them)")
        need = " (it reads a listing's columns: give --listing)" if name in LISTING_SHAPE else ""
        raise UsageError(f"{where}: {was}, which this append cannot take{need}")


def option_text(name: str, value: Any) -> str:
    """An option as typed: "--format both", "--stratify", "--label-separator ' ' (a space)"."""
    flag = "--" + name.replace("_", "-")
    return flag if value is True else f"{flag} {shown(value)}"


def with_option(name: str, value: Any) -> str:
    """"with --format both", "without --image-size"."""
    if value is None or value is False or value == []:
        return "without --" + name.replace("_", "-")
    if name == "splits" and isinstance(value, str):
        return f"with splits {value}"  # "from folders", "from column fold"
    return "with " + option_text(name, value)


def shown(value: Any) -> str:
    if isinstance(value, str) and value and not value.strip():
        return f"{value!r} (a space)" if value == " " else repr(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
