"""Errors the command line reports as one line."""
from __future__ import annotations

import argparse


class UsageError(ValueError):
    """A bad option, input or output, found before any work started."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one UsageError line instead of a usage block."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(message)
