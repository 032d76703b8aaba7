"""The findings of a build's quality checks: one JSON object a line in `quality.jsonl`.

Every finding names its kind, the source ids it is about and the split of each (`sources` and `splits`, the
same length, in the same order), plus what was measured. One image's flags name one source; a near-duplicate
cluster or a label conflict names all its members (the first sorts the file: put the one kept first). A finding whose
sources lie in several splits is a leak.
"""
from __future__ import annotations

import json
from typing import Any

from shard_utils.errors import TpuShardsError

__all__ = [
    "NEAR_DUPLICATE", "LABEL_CONFLICT", "SMALL", "ASPECT", "BLUR", "OVEREXPOSED", "UNDEREXPOSED", "GRAYSCALE",
    "CLUSTER_KINDS", "IMAGE_KINDS", "KINDS", "BadFinding", "finding", "check", "leaks", "from_line", "counts"
]

NEAR_DUPLICATE = "near_duplicate"  # images whose signatures are within NEAR_DISTANCE bits
LABEL_CONFLICT = "label_conflict"  # near-duplicates with different labels
SMALL = "small"
ASPECT = "aspect"
BLUR = "blur"
OVEREXPOSED = "overexposed"
UNDEREXPOSED = "underexposed"
GRAYSCALE = "grayscale"
CLUSTER_KINDS = (NEAR_DUPLICATE, LABEL_CONFLICT)
IMAGE_KINDS = (SMALL, ASPECT, BLUR, OVEREXPOSED, UNDEREXPOSED, GRAYSCALE)
KINDS = CLUSTER_KINDS + IMAGE_KINDS


class BadFinding(ValueError, TpuShardsError):
    """A finding (or a line of quality.jsonl) that does not have the shape above."""


def finding(kind: str, sources: list[str] | tuple[str, ...], splits: list[str] | tuple[str, ...],
            **details: Any) -> dict:
    """A finding, checked: `details` are JSON values (a flag's `value` and `threshold`, a cluster's `distance`)."""
    made = {"kind": kind, "sources": list(sources), "splits": list(splits), **details}
    check(made)
    return made


def check(made: Any) -> dict:
    """The finding itself when it has the shape of one, else BadFinding saying what is wrong."""
    if not isinstance(made, dict):
        raise BadFinding(f"a finding is a JSON object, not {type(made).__name__}")
    kind, sources, splits = made.get("kind"), made.get("sources"), made.get("splits")
    if kind not in KINDS:
        raise BadFinding(f"unknown finding kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) for s in sources):
        raise BadFinding(f"{kind} finding: `sources` must be a non-empty list of source ids")
    if not isinstance(splits, list) or len(splits) != len(sources) or not all(isinstance(s, str) for s in splits):
        raise BadFinding(f"{kind} finding: `splits` must name the split of each source")
    if kind in IMAGE_KINDS and len(sources) != 1:
        raise BadFinding(f"{kind} finding is about one image, not {len(sources)}")
    if kind in CLUSTER_KINDS and len(sources) < 2:
        raise BadFinding(f"{kind} finding is about two images or more")
    return made


def leaks(made: dict) -> bool:
    """Whether the finding's sources lie in more than one split (a near-duplicate across train and test); its
    sources `rejected` (--near-dups drop, --dedup) are in none."""
    gone = set(made.get("rejected", ()))
    return len({split for source, split in zip(made["sources"], made["splits"], strict=True) if source not in gone}) > 1


def from_line(line: str) -> dict:
    """The finding of one line of quality.jsonl; BadFinding when it is not one. (The build writes the lines with
    the other reports, sorted by first source: `beam_jobs.publish.reports`.)"""
    try:
        parsed = json.loads(line)
    except ValueError as exc:
        raise BadFinding(f"not JSON: {exc}") from None
    return check(parsed)


def counts(findings) -> dict[str, int]:
    """Findings per kind, every kind named (0 when none): the manifest's `quality.counts`."""
    out = dict.fromkeys(KINDS, 0)
    for made in findings:
        out[made["kind"]] += 1
    return out
