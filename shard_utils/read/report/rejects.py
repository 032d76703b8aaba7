"""What the report says of rejected files: the first entries of rejected.jsonl, and counts by reason from the
manifest (both hostile input: malformed lines and values are shown or left out, never trusted)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shard_utils import storage
from shard_utils.format.manifest import MAX_REPORT_LINE, Manifest, bounded_lines

__all__ = ["FIRST_REJECTED", "RejectedRows", "first_rejected", "reason_counts"]

FIRST_REJECTED = 50  # rejected files listed on the page


def reason_counts(part: Any) -> dict[str, int]:
    """A manifest part's (rejected or skipped) positive counts by reason; anything malformed is left out."""
    by_reason = part.get("by_reason", {}) if isinstance(part, dict) else {}
    if not isinstance(by_reason, dict):
        return {}
    return {str(k): v for k, v in by_reason.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


@dataclass(frozen=True)
class RejectedRows:
    """The first rejected files (source, reason, message), how many lines the file has, and any read problem."""

    rows: list[tuple[str, str, str]]
    total: int
    problem: str | None = None


def first_rejected(m: Manifest, limit: int = FIRST_REJECTED) -> RejectedRows:
    """The first `limit` entries of the dataset's rejected.jsonl (its path is checked when the manifest loads)."""
    name = m.rejected.get("path")
    if not m.rejected.get("count") or not isinstance(name, str):
        return RejectedRows([], 0)
    path = storage.join(m.location, name)
    rows: list[tuple[str, str, str]] = []
    total = 0
    try:
        with storage.open_read(path) as f:  # a line at a time, each bounded: the report may be of any size
            for raw in bounded_lines(f):
                if raw is not None and not raw.strip():
                    continue
                total += 1
                if len(rows) < limit:
                    rows.append(_row(total, raw))
    except storage.StorageError as exc:
        return RejectedRows([], 0, str(exc))
    return RejectedRows(rows, total)


def _row(number: int, raw: bytes | None) -> tuple[str, str, str]:
    """(source, reason, message) of one line of the report, or what the line is when it is not an entry."""
    if raw is None:
        return (f"line {number}", f"(longer than {MAX_REPORT_LINE} bytes)", "")
    line = raw.decode("utf-8", "replace").strip()
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        entry = None
    if isinstance(entry, dict):
        return str(entry.get("source", "")), str(entry.get("reason", "")), str(entry.get("message", ""))
    return (f"line {number}", "(not a JSON object)", line[:300])
