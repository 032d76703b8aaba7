"""Errors the command line reports as one line, and how a command's errors become that line and its exit code."""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence

from shard_utils.errors import InternalError, TpuShardsError
from shard_utils.extras import MissingExtra
from shard_utils.text import printable

__all__ = ["TpuShardsError", "UsageError", "OneLineParser", "unknown_option", "user_message", "guarded", "exit_now"]


class UsageError(ValueError, TpuShardsError):
    """A bad option, input or output, found before any work started."""


def unknown_option(name: str, known: Sequence[str], prog: str) -> UsageError:
    """The error for an option no one defines, naming the closest known option when there is one."""
    hint = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not hint and name.replace("_", "-") in known:
        hint = [name.replace("_", "-")]
    return UsageError(f"unknown option {name}" + (f"; did you mean {hint[0]}?" if hint else f" (see {prog} --help)"))


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one UsageError line instead of a usage block, and an unknown
    option with the closest one it knows."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(message)

    def option_names(self) -> list[str]:
        """Every long option this parser defines."""
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]

    def parse_known_args(self, args=None, namespace=None):  # noqa: D401 - argparse's entry point
        args = list(sys.argv[1:] if args is None else args)
        self.refuse_repeats(args)
        return super().parse_known_args(args, namespace)

    def refuse_repeats(self, args: Sequence[str]) -> None:
        """Refuse an option given twice (or with its negation), which argparse would settle silently by the last
        one; options meant to repeat (append actions such as --listing) may."""
        seen: dict[str, str] = {}
        for arg in args:
            if arg == "--":
                return
            name = arg.split("=", 1)[0]
            action = self._option_string_actions.get(name) if arg.startswith("--") else None
            if action is None or isinstance(action, (argparse._AppendAction, argparse._HelpAction)):
                continue
            if action.dest in seen:
                first = seen[action.dest]
                raise UsageError(f"{name} is given twice; give it once" if first == name else
                                 f"{first} and {name} are both given; give one of them")
            seen[action.dest] = name

    def parse_args(self, args=None, namespace=None):  # noqa: D401 - argparse's entry point
        parsed, rest = self.parse_known_args(args, namespace)
        for arg in rest:
            if arg.startswith("-") and arg not in ("-", "--"):
                raise unknown_option(arg.split("=", 1)[0], self.option_names(), self.prog)
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return parsed


USAGE = (UsageError, MissingExtra)  # exit 2: the command cannot run as given, or not on this installation
_WRAPPED = re.compile(r"(?:UsageError|MissingExtra|PlanError|ManifestError|StorageError|NotFoundError|"
                      r"TransientReadError|OutOfMemory): (.+)")


def user_message(exc: BaseException) -> str | None:
    """The one-line message of a known error (any TpuShardsError but an InternalError, a bug), even when a Beam
    runner wrapped it."""
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TpuShardsError) and not isinstance(current, InternalError):
            return str(current).split(" [while running")[0].strip().splitlines()[0]
        match = _WRAPPED.search(str(current))
        if match:
            return match.group(1).split(" [while running")[0].strip()
        current = current.__cause__ or current.__context__
    return None


def guarded(fn: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None) -> int:
    """Run a command; known errors print one line and exit 1 (2 for usage), anything else exits 3."""
    if not os.environ.get("TPU_SHARDS_DEBUG"):
        # Beam's local runner logs a failing step's whole traceback; the one line printed below says it better.
        for name in ("apache_beam.runners.common", "apache_beam.runners.worker", "apache_beam.runners.portability"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        fn(argv)
        return 0
    except KeyboardInterrupt as exc:  # a command may say what state it left (KeyboardInterrupt("..."))
        print("tpu-shards: interrupted" + (f"; {exc.args[0]}" if exc.args else ""), file=sys.stderr)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except Exception as exc:  # noqa: BLE001 - the CLI's job is to turn errors into one line
        message = user_message(exc)
        if message is not None:
            print(f"tpu-shards: error: {printable(message)}", file=sys.stderr)
            return 2 if isinstance(exc, USAGE) else 1
        if os.environ.get("TPU_SHARDS_DEBUG"):
            traceback.print_exc()
        first = printable((str(exc).strip().splitlines() or [""])[0][:300])
        print(f"tpu-shards: internal error: {type(exc).__name__}: {first} (set TPU_SHARDS_DEBUG=1 for details)",
              file=sys.stderr)
        return 3


def exit_now(code: int) -> None:
    """End the process with `code` once the command is done: output flushed, no interpreter teardown.

    Beam's runner leaves threads that the interpreter's shutdown can wait on (and a Ctrl-C landing during
    that shutdown would kill the process without a word); everything the command wrote is complete here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
