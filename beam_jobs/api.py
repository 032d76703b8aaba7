"""`build(...)`: the `tpu-shards build` job called from Python (a notebook, a script), returning the manifest.

Keyword arguments are the command's options with underscores (`image_size=224` is `--image-size 224`); they go
through the same parser and the same checks, and a problem is raised (UsageError, a ValueError, for bad options;
the one-line error for a build that fails) instead of printed with an exit code.
"""
from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from beam_jobs.errors import UsageError, user_message
from shard_utils.errors import TpuShardsError

__all__ = ["build", "BuildFailed"]


class BuildFailed(RuntimeError, TpuShardsError):
    """A build that started and could not publish (nothing usable was written): the CLI's one-line reason."""


def build(input: str | os.PathLike | None = None, output: str | os.PathLike | None = None, *,
          splits: Mapping[str, float] | str | None = None, beam_args: Sequence[str] = (), **options: Any):
    """Build shards and a manifest from `input` into `output`, as `tpu-shards build` does; returns the Manifest
    (None when Beam's options only created a Dataflow template).

    `splits`: {"train": 0.9, "validation": 0.1} (or the option's text). Other options by their names:
    `image_size=224` or `(224, 160)`, `stratify=True`, `listing="train.csv"` (or a list), `num_cores=8`,
    `append=True`; False or None leaves an option out. `beam_args`: Beam's own options, as on the command line
    (e.g. `["--runner=DataflowRunner", "--project=p"]`). Raises UsageError for a bad option or input (before any
    work), BuildFailed (or the job's own error) for a build that could not publish.
    """
    from beam_jobs.jobs import build as job
    from beam_jobs.jobs.options import parser

    actions = {a.dest: a for a in parser()._actions if a.option_strings and a.help != argparse.SUPPRESS}
    given = {"input": input, "output": output, "splits": splits, **options}
    argv = [arg for name, value in given.items() for arg in option_args(name, value, actions)]
    try:
        return job.run([*argv, *map(str, beam_args)])
    except TpuShardsError:  # the job's own error, one line (or an InternalError: a bug), raised as it is
        raise
    except Exception as exc:  # a Beam runner wraps the job's one-line error in its own
        message = user_message(exc)
        if message is None:
            raise
        raise BuildFailed(message) from exc


def option_args(name: str, value: Any, actions: Mapping[str, argparse.Action]) -> list[str]:
    """One keyword argument as command-line arguments ([] when it is None or False); UsageError for a name the
    build does not have, naming the closest one."""
    action = actions.get(name)
    if action is None:
        hint = difflib.get_close_matches(name, list(actions), n=1, cutoff=0.6)
        raise UsageError(f"build() has no option {name!r}" + (f"; did you mean {hint[0]}?" if hint else ""))
    flag = next(s for s in action.option_strings if s.startswith("--"))
    if value is None:
        return []
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else "--no-" + flag[2:]]
    if isinstance(value, bool) and action.nargs == 0:
        return [flag] if value else []
    if isinstance(action, argparse._AppendAction) and isinstance(value, (list, tuple)):
        return [arg for item in value for arg in (flag, os.fspath(item))]
    if isinstance(value, Mapping):
        return [flag, ",".join(f"{k}={v}" for k, v in value.items())]
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(map(str, value))]
    return [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
