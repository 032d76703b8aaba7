"""What the report says of rejected files: the first entries of rejected.jsonl, and counts by reason from the
manifest (both hostile input: malformed lines and values are shown or left out, never trusted)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shard_utils import storage
from shard_utils.format.manifest import Manifest

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
    try:
        lines = [line for line in storage.read_bytes(path).decode("utf-8", "replace").splitlines() if line.strip()]
    except storage.StorageError as exc:
        return RejectedRows([], 0, str(exc))
    rows = []
    for number, line in enumerate(lines[:limit], start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            rows.append(tuple(str(entry.get(k, "")) for k in ("source", "reason", "message")))
        else:
            rows.append((f"line {number}", "(not a JSON object)", line[:300]))
    return RejectedRows(rows, len(lines))
