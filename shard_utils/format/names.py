"""Rules for names that become parts of paths: split names, and the parts of a file's path inside a dataset.

One rule wherever a name comes from (--splits, a listing's split column, a manifest read back), so that a
name the build accepts is one every reader accepts, and a manifest cannot steer a tool's writes elsewhere.
"""
from __future__ import annotations

import re
import unicodedata

__all__ = [
    "MAX_NAME", "MAX_PATH", "shown", "split_name_problem", "generation_name_problem", "path_part_problem",
    "gcs_name_problem", "escaped_name"
]

MAX_NAME = 200  # characters in a split name or in one part of a path inside a dataset
MAX_PATH = 1000  # characters in a path inside a dataset
_SPLIT = re.compile(r"[A-Za-z0-9_-]+")
_GENERATION = re.compile(r".+-g[0-9]{3,}")  # filenames.generation_split: generation 1 of `train` is `train-g001`


def shown(name: object, limit: int = 60) -> str:
    """A name as a message quotes it: repr (control characters escaped), cut to about `limit` characters."""
    text = repr(name)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def split_name_problem(name: object) -> str | None:
    """Why `name` cannot name a split (it becomes part of shard, index and folder names), or None."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if not _SPLIT.fullmatch(name):
        return "may use only ASCII letters, digits, '_' and '-'"
    return None


def generation_name_problem(name: str) -> str | None:
    """Why a new split may not have `name`: one ending like a generation (`train-g001`) would collide with the
    names `build --append` gives the generations of another split. Checked when a build names its splits."""
    if _GENERATION.fullmatch(name):
        return "ends like the name of a generation (-gNNN: build --append stores generation N of split X as X-gNNN)"
    return None


def path_part_problem(part: str) -> str | None:
    """Why one '/'-separated part of a relative path cannot name a file or folder inside a dataset, or None."""
    if part in ("", ".", ".."):
        return "has an empty, '.' or '..' part"
    if len(part) > MAX_NAME:
        return f"has a part longer than {MAX_NAME} characters"
    if any(unicodedata.category(c)[0] == "C" for c in part):
        return "holds a control or format character"
    return None


def gcs_name_problem(uri: str) -> str | None:
    """Why a gs://bucket/name URI is not a plain path (an empty, '.' or '..' part: `gs://b//x`, `gs://b/a/../x`),
    or None. Cloud Storage would take such names literally, never as the folder they look like."""
    name = uri.partition("://")[2].partition("/")[2]
    parts = name.split("/")
    if parts and parts[-1] == "":
        parts.pop()  # a folder's trailing '/'
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' part; Cloud Storage would not read it as the folder it looks like"
    return None


def escaped_name(name: str) -> str:
    """A file name as UTF-8 text that still names exactly one file, for source ids and labels.

    A UTF-8 name is returned unchanged. A name whose bytes are not UTF-8 comes (as Python reads it with
    surrogateescape) with each undecodable byte as U+DC80..U+DCFF: each such byte becomes %XX and each '%' %25,
    so percent-decoding gives the name's bytes back, and `extract` writes it under this safe, readable name.
    Raises ValueError for a lone surrogate no byte gives (a JSON "\\ud800"), which names no file.
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    out = []
    for c in name:
        code = ord(c)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"%{code - 0xDC00:02X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"holds the lone surrogate \\u{code:04x}, which is no byte of a file name")
        else:
            out.append("%25" if c == "%" else c)
    return "".join(out)
