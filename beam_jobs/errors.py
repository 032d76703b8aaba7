"""Errors the command line reports as one line."""
from __future__ import annotations

import argparse
import difflib
from typing import Sequence


class UsageError(ValueError):
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

    def parse_args(self, args=None, namespace=None):  # noqa: D401 - argparse's entry point
        parsed, rest = self.parse_known_args(args, namespace)
        for arg in rest:
            if arg.startswith("-") and arg not in ("-", "--"):
                raise unknown_option(arg.split("=", 1)[0], self.option_names(), self.prog)
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return parsed
