"""How text from outside (file names, labels, listing cells, messages quoting them) is shown on a terminal, in logs
and on the report: one function, so a name never reaches a terminal as a control sequence (colours, a new window
title) or breaks a one-line message.
"""
from __future__ import annotations

__all__ = ["printable", "printable_lines"]


def printable(text: str, limit: int | None = None) -> str:
    """`text` with every character Python does not call printable (controls, format characters such as U+202E,
    line and paragraph separators, spaces other than ' ') shown as an escape (\\n, \\x1b, \\u202e), the way
    `repr` shows them; cut to `limit` characters with an ellipsis."""
    out = text if text.isprintable() else "".join(c if c.isprintable() else _escape(c) for c in text)
    if limit is not None and len(out) > limit:
        out = out[:max(limit - 1, 0)] + "\u2026"
    return out


def printable_lines(text: str) -> str:
    """Lines of text (a summary) each made printable, the line breaks between them kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
