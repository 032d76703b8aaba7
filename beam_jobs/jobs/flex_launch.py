"""The Flex Template launch: turn the launcher's ``--name=value`` parameters into the job's options, then run it.

Dataflow's Python launcher runs ``dataflow/main.py`` with every template parameter as ``--name=value``,
plus Beam options such as ``--runner``, ``--temp_location`` and ``--template_location``. Parameters are
named by the options' dest (``image_size``) and flags arrive as ``--overwrite=true``; both are rewritten to
the job's own spelling (``--image-size=224``, ``--overwrite``) here, so the job's parser needs no
Flex-only aliases. Anything else (Beam options) passes through untouched.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from beam_jobs.errors import UsageError
from beam_jobs.jobs.flex_metadata import is_flag, job_options, job_parser, long_option

__all__ = [
    "WORKER_CODE", "flex_argv", "check_options", "option_value", "with_runner", "check_worker_code", "launch_argv",
    "main"
]

TRUE, FALSE = ("true",), ("false",)
# Options that give Dataflow workers this package: the image built from dataflow/Dockerfile, or a staged sdist.
WORKER_CODE = ("--sdk_container_image", "--worker_harness_container_image", "--setup_file")


def flex_argv(argv: Sequence[str], ap: argparse.ArgumentParser | None = None) -> list[str]:
    """Rewrite ``--dest=value`` and ``--flag=true|false`` into the job's spellings; leave the rest alone."""
    ap = ap or job_parser()
    known: dict[str, argparse.Action] = {}
    for action in job_options(ap):
        known[action.dest] = action
        known.update({s[2:]: action for s in action.option_strings if s.startswith("--")})
    out: list[str] = []
    for arg in argv:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        action = known.get(name) if eq else None
        if action is None:
            out.append(arg)
        elif is_flag(action):
            if value.lower() not in TRUE + FALSE:
                raise UsageError(f"--{name} must be true or false, not {value!r}")
            wanted = value.lower() in TRUE
            if wanted != bool(action.default):  # store_true set to true, or store_false set to false
                out.append(long_option(action))
        else:
            out.append(f"{long_option(action)}={value}")
    return out


def _raise_usage(message: str) -> NoReturn:
    raise UsageError(message)


def check_options(argv: Sequence[str]) -> None:
    """Parse the job's options once with errors as one line (argparse would print its usage block first)."""
    ap = job_parser()
    ap.error = _raise_usage  # type: ignore[method-assign]
    ap.parse_known_args(list(argv))


def option_value(argv: Sequence[str], option: str) -> str | None:
    """The last value given for a Beam option, as --option=value or --option value; None if absent."""
    found = None
    for i, arg in enumerate(argv):
        if arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
        elif arg == option and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def with_runner(argv: Sequence[str]) -> list[str]:
    """The launcher's arguments with Dataflow as the runner unless one was given (a Flex launch never runs locally)."""
    args = list(argv)
    if option_value(args, "--runner") is None:
        args.append("--runner=DataflowRunner")
    return args


def check_worker_code(argv: Sequence[str]) -> None:
    """Refuse a Dataflow launch whose workers would not have this package (they would fail on import)."""
    if (option_value(argv, "--runner") or "").lower() not in ("dataflowrunner", "dataflow"):
        return
    if not any(a.split("=", 1)[0] in WORKER_CODE for a in argv):
        raise UsageError("Dataflow workers need this package: pass sdk_container_image=IMAGE (the template's own "
                         "image) as a parameter, e.g. gcloud dataflow flex-template run ... "
                         "--parameters sdk_container_image=IMAGE")


def launch_argv(argv: Sequence[str]) -> list[str]:
    """The job's command line for a Flex Template launch, checked; raises UsageError with the reason."""
    args = with_runner(flex_argv(argv))
    if "-h" in args or "--help" in args:
        return args
    check_options(args)
    check_worker_code(args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of dataflow/main.py: rewrite the launcher's arguments, then run build_shards.main."""
    from beam_jobs.jobs.build import main as build_main

    try:
        args = launch_argv(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"tpu-shards: error: {exc}", file=sys.stderr)
        return 2
    return build_main(args)
