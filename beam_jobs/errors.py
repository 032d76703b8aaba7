"""Errors the command line reports as one line."""


class UsageError(ValueError):
    """A bad option, input or output, found before any work started."""
